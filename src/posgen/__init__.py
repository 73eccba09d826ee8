"""posgen: how LLMs compute with positions, as a reproducible workflow."""

__version__ = "0.1.0"
