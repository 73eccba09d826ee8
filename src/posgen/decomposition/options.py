"""The decomposition's options: config section ``decomposition`` and the job's ``device``, as one frozen value that
every entry point which decomposes takes (the store path's ``decompose_store``, the fused path's ``Analysis``, the
API's ``decompose``, the benchmarks). Standard library only, so that the shims build it without torch.
"""

from __future__ import annotations

import dataclasses

# the config leaves under `decomposition` (schemas/config.schema.yaml), in the order of the fields below
SECTION_KEYS = ("dummy_distances", "dummy_distance", "lstsq_tol", "precision", "bound_rows", "bound_samples")


@dataclasses.dataclass(frozen=True)
class DecompositionOptions:
    """``dummy_distances`` the sweep of D, ``dummy_distance`` the D of Method A's r, r_g and the bound (method.md
    section 4); ``lstsq_tol`` Method B's tolerance; ``precision`` the dtype of the moments' products;
    ``bound_rows`` the query rows of the error and bound pass (0: all) on the windows with a global index below
    ``bound_samples`` (0: all; section 5); ``device`` auto, cpu or cuda."""

    dummy_distances: tuple[int, ...]
    dummy_distance: int
    lstsq_tol: float
    precision: str
    bound_rows: int
    bound_samples: int
    device: str = "auto"

    def __post_init__(self):
        # frozen: the normalised values go in through object.__setattr__ (config lists become a hashable tuple)
        object.__setattr__(self, "dummy_distances", tuple(int(D) for D in self.dummy_distances))
        object.__setattr__(self, "dummy_distance", int(self.dummy_distance))
        object.__setattr__(self, "lstsq_tol", float(self.lstsq_tol))
        object.__setattr__(self, "bound_rows", int(self.bound_rows))
        object.__setattr__(self, "bound_samples", int(self.bound_samples))

    @classmethod
    def of(cls, values, device: str | None = None) -> DecompositionOptions:
        """The options from a mapping holding the section's keys (a rule's params, a config section), and
        ``device`` (else the mapping's ``device``)."""
        device = values["device"] if device is None else device
        return cls(**{key: values[key] for key in SECTION_KEYS}, device=device)

    @classmethod
    def defaults(cls, **overrides) -> DecompositionOptions:
        """The schema's defaults of the section and of ``device``, with ``overrides`` (a caller outside the
        workflow, e.g. ``posgen.decompose(qk, dummy_distance=500)``)."""
        from posgen.config import schema_default, schema_defaults

        unknown = sorted(set(overrides) - set(SECTION_KEYS) - {"device"})
        if unknown:
            raise TypeError(f"decomposition options: unknown {', '.join(unknown)} (known: {', '.join(SECTION_KEYS)})")
        values = {**schema_defaults("decomposition", SECTION_KEYS), "device": schema_default("device")}
        return cls(**{**values, **overrides})
