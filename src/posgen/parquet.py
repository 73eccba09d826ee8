"""posgen's Parquet tables (results/heads.parquet, a collection's heads.parquet, results/verdicts.parquet) under
the digest and identity scheme of its .nc/.h5 files (docs/data-model.md, "Checksums and digests").

Written with Parquet's own page checksums (verified on every read: damaged bytes) and, in the file's key-value
metadata, the content digest of the table (:func:`table_digest`: a plausible edit that rewrites valid pages, e.g.
a value changed with pyarrow and the metadata kept) and what the file is (``posgen_identity``, from its path: a
valid table in another's place). :func:`read_table` checks all three and refuses, in one line naming the file and
the command that remakes it, a damaged, edited or swapped table, and one that carries no digest (written by
another writer, which drops posgen's metadata, or before the digest existed).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from posgen.integrity import (
    CONTENT_ATTR,
    IDENTITY_ATTR,
    damaged,
    identity_attr,
    remake_command,
    shown,
    table_digest,
    verified_table,
)
from posgen.store import atomic_path


def write_table(table: pd.DataFrame, path, **metadata: str) -> None:
    """``table`` as Parquet at ``path`` (atomically) with page checksums, its content digest, its identity and
    ``metadata`` (provenance) in the file's key-value metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = pa.Table.from_pandas(table, preserve_index=False)
    # the digest of the table as a reader gets it back (Arrow's types, not the frame's own: int32 layers, str columns)
    ours = {CONTENT_ATTR: table_digest(arrow.to_pandas()), **{k: str(v) for k, v in metadata.items()}}
    if identity_attr(path):
        ours[IDENTITY_ATTR] = identity_attr(path)
    arrow = arrow.replace_schema_metadata({**arrow.schema.metadata, **{k: v.encode() for k, v in ours.items()}})
    with atomic_path(path) as tmp:
        pq.write_table(arrow, tmp, write_page_checksum=True)


def read_table(path, columns=()) -> pd.DataFrame:
    """A posgen Parquet table as a DataFrame, checked (posgen.integrity.verified_table: its pages' checksums, its
    identity, its content digest); ``columns`` it must have. One line naming the file (and the command that remakes
    it) where it is missing, damaged, edited, another table, or not written by posgen."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{shown(path)}: no such file (run: {remake_command(path)})")
    table = verified_table(path)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise damaged(path, f"not the table it should be (no column {', '.join(missing)})")
    return table
