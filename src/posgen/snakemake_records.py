"""Snakemake's own records of a run that posgen reads: the outputs it marks incomplete (a job killed before it
ended; ``python -m posgen.integrity --incomplete`` says whether each is whole and what to run)."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

# Where Snakemake marks the outputs of a job that has started and not ended (its file-based records: one file per
# output, named by the output's path in URL-safe base64, long names cut into folders whose names start with @)
INCOMPLETE_DIR = Path(".snakemake/incomplete")


def incomplete_files(workdir: str | Path = ".") -> list[str]:
    """The outputs Snakemake marks incomplete in ``workdir`` (a run killed while their jobs ran), as it names them."""
    root = Path(workdir) / INCOMPLETE_DIR
    names = []
    for marker in sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []:
        encoded = "".join(part.removeprefix("@") for part in marker.relative_to(root).parts)
        try:
            names.append(base64.urlsafe_b64decode(encoded).decode())
        except (binascii.Error, ValueError):  # Snakemake's own bookkeeping (migration_underway)
            continue
    return names
