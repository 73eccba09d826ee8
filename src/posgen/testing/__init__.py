"""Test support, for the test suite and for trying the workflow by hand; the workflow itself uses only
:mod:`posgen.testing.faults` (inert unless the environment asks for a failure).

- :mod:`posgen.testing.faults`: fault injection (``POSGEN_FAIL_ONCE``) that the workflow scripts call.
- :mod:`posgen.testing.tiny`: tiny random-weight checkpoints of every supported decoder family.
- :mod:`posgen.testing.qk_store`: a ``qk.h5`` built from given q/k arrays and a RoPE table.
- :mod:`posgen.testing.datasets`: small q/k and decomposition datasets with known values.
- :mod:`posgen.testing.runs`: snakemake runs of the repository's Snakefile in a scratch directory.

Nothing is imported here, so that importing one of them loads only what it needs.
"""
