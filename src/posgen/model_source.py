"""The error of a model source that cannot be used: below both posgen.models (acquisition) and posgen.parts (the
parted GGUFs it joins), so that neither imports the other for it."""


class ModelSourceError(RuntimeError):
    """A model source that cannot be used, phrased as one line naming the source."""
