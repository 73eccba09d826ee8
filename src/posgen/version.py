"""posgen's version (``posgen.__version__``), recorded as ``posgen_version`` in every output's provenance; its own
module so that the store reads it without importing the package's face (posgen/__init__.py, which hands on the
notebook API)."""

VERSION = "0.1.0"
