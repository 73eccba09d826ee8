"""Benchmarks: each prints ratios measured side by side in one run (``python -m posgen.bench <name>``)."""
