"""Integrity of posgen's files: content digests (written with the data, checked on every read), the one-line
error of a damaged or edited file with the command that remakes it, and the lineage that tells which outputs were
made from an older version of their inputs (``python -m posgen.integrity [DIR ...]``; docs/data-model.md,
"Checksums and digests"). No xarray or torch here: the check runs anywhere."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import zlib
from pathlib import Path

import numpy as np


class StoreError(OSError):
    """A posgen file that cannot be read (missing, truncated, failing its checksum or its digest), as one line
    naming the file and the command that remakes it."""


# On a data variable: the CRC-32 of its stored bytes, computed while writing and checked on every read (a
# plausible edit keeps HDF5's Fletcher-32 checksums valid; it cannot keep this digest).
DIGEST_ATTR = "posgen_digest"
# On a large variable written block by block (qk.h5's q, k, logits_ref): the dims that index its blocks; the
# digests of the blocks are the variable "<name>_digest" over those dims, so a reader checks only what it reads.
BLOCK_DIGEST_ATTR = "posgen_digest_blocks"
EDITED = "its data differ from what posgen wrote (edited or damaged after it was written)"


def digest(array: np.ndarray) -> int:
    """CRC-32 of ``array``'s bytes in C order (4 GB/s: negligible beside writing or reading them)."""
    return zlib.crc32(np.ascontiguousarray(array))


def shown(path: str | Path) -> str:
    """``path`` as every message shows it: relative to the working directory when it lies below it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def remake_command(path: str | Path) -> str:
    """The command that remakes ``path`` on either path of the workflow (fused or store): Snakemake finds the
    rule that writes it."""
    return f"snakemake --cores all {shown(path)} (with the run's own --configfile, if it had one)"


def damaged(path: str | Path, what: str) -> StoreError:
    """The one-line error of a damaged file: ``what`` went wrong, delete it, and the command that remakes it."""
    return StoreError(f"{shown(path)}: {what}; delete it and run: {remake_command(path)}")


def verified_read(wrapper, key: tuple, read):
    """``read(wrapper, key)``, checked against the digests posgen wrote (:data:`DIGEST_ATTR`,
    :data:`BLOCK_DIGEST_ATTR`): the whole variable, or every block the key touches, is read (HDF5 reads whole
    chunks anyway), its digest compared, then the key applied. A variable without digests is read as it is."""
    var = wrapper.get_array()
    attrs = var.attrs
    name, path = wrapper.variable_name, wrapper.datastore._filename
    ndim = len(wrapper.shape)
    if DIGEST_ATTR in attrs:
        data = np.asarray(read(wrapper, (slice(None),) * ndim))  # posgen's tables: small
        if digest(data) != int(attrs[DIGEST_ATTR]):
            raise damaged(path, f"variable {name}: {EDITED}")
        return data[key]
    if BLOCK_DIGEST_ATTR not in attrs:
        return read(wrapper, key)
    dims = var.dimensions
    axes = [dims.index(dim) for dim in str(attrs[BLOCK_DIGEST_ATTR]).split()]
    # the blocks the key touches, every other dim whole; an integer keeps its axis (i:i+1) until the end
    wide, rest = [slice(None)] * ndim, list(key)
    for axis in axes:
        part = key[axis]
        wide[axis] = slice(part, part + 1) if isinstance(part, (int, np.integer)) else part
        rest[axis] = 0 if isinstance(part, (int, np.integer)) else slice(None)
    data = np.asarray(read(wrapper, tuple(wide)))
    blocks = [np.arange(wrapper.shape[axis])[wide[axis]] for axis in axes]  # the block indices read, per axis
    with wrapper.datastore.lock:
        f = wrapper.datastore._acquire(needs_lock=False)
        recorded = np.asarray(f.variables[f"{name}_digest"][...])  # (block dims...)
    for position in itertools.product(*[range(len(b)) for b in blocks]):
        index = [slice(None)] * ndim
        for axis, i in zip(axes, position):
            index[axis] = i
        block = tuple(b[i] for b, i in zip(blocks, position))
        if digest(data[tuple(index)]) != int(recorded[block]):
            where = ", ".join(f"{dims[axis]} {b}" for axis, b in zip(axes, block))
            raise damaged(path, f"variable {name} ({where}): {EDITED}")
    return data[tuple(rest)]


# Global attrs of every posgen .nc/.h5: a digest of the whole file's data (from its variables' digests), and the
# content digests of the files the job that wrote it read, by path (relative to the working directory).
CONTENT_ATTR = "posgen_content_digest"
INPUTS_ATTR = "posgen_inputs"
_job_inputs: list[Path] = []  # the running job's input files (record_inputs)


# Global attr of every file written by posgen.store.write_netcdf: the digest of its other global attrs as stored
# (scores, settings and provenance kept as attributes), checked when posgen opens the file.
ATTRS_ATTR = "posgen_attrs_digest"
UNDIGESTED_ATTRS = (ATTRS_ATTR, CONTENT_ATTR, INPUTS_ATTR)  # digests of their own, or the running job's inputs


def attrs_digest(attrs) -> str:
    """The digest of a file's global attrs as h5py reads them (``_``-prefixed netCDF bookkeeping and
    :data:`UNDIGESTED_ATTRS` left out), canonical whatever numpy type each comes back as."""
    plain = {
        name: np.asarray(value).tolist()
        for name, value in attrs.items()
        if not name.startswith("_") and name not in UNDIGESTED_ATTRS
    }
    canonical = json.dumps(plain, sort_keys=True, default=str)
    return f"{zlib.crc32(canonical.encode()):08x}"


def content_digest(digests: dict) -> str:
    """A file's content digest from the digests of its variables (name -> int or array of block digests)."""
    canonical = json.dumps({name: np.asarray(value).tolist() for name, value in sorted(digests.items())})
    return f"{zlib.crc32(canonical.encode()):08x}"


def record_inputs(paths) -> None:
    """The files the running job reads (its rule's inputs): every output it writes records their digests."""
    _job_inputs[:] = [Path(p) for p in paths]


def _file_attr(path: Path, name: str) -> str | None:
    """A global attr of an HDF5 file as text, read without its data; None where it is missing or the file is not
    readable (its reader says why, with the command that remakes it)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            value = f.attrs.get(name)
    except OSError:
        return None
    return None if value is None else str(value.decode() if isinstance(value, bytes) else value)


def current_digest(path: Path) -> str | None:
    """What a file's digest is now: a posgen file's content digest (a global attr, read without its data), else
    the CRC-32 of a small file's bytes (a manifest, a CSV); None for a missing, large or unreadable file."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.suffix in (".nc", ".h5"):
        return _file_attr(path, CONTENT_ATTR)
    if path.stat().st_size > 64 * 2**20:
        return None
    return f"{zlib.crc32(path.read_bytes()):08x}"


def input_digests() -> str:
    """:data:`INPUTS_ATTR` of an output the running job writes: JSON of ``{path: digest}`` of its inputs."""
    return json.dumps({shown(p): current_digest(p) for p in _job_inputs if Path(p).is_file()}, sort_keys=True)


def stale(paths) -> list[str]:
    """One line for each posgen file among ``paths`` (files or folders, searched for .nc/.h5) that was made from
    another version of one of its inputs than the one there now (or from an input that is gone)."""
    files = []
    for path in map(Path, paths):
        files += sorted(p for p in path.rglob("*") if p.suffix in (".nc", ".h5")) if path.is_dir() else [path]
    lines = []
    for path in files:
        recorded = _file_attr(path, INPUTS_ATTR)
        if recorded is None:
            continue
        for source, then in sorted(json.loads(recorded).items()):
            now = current_digest(Path(source))
            if then is not None and now != then:
                change = "is gone" if now is None and not Path(source).exists() else "has changed since"
                lines.append(f"{shown(path)}: made from {source}, which {change}; remake it: {remake_command(path)}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posgen.integrity",
        description="List the posgen files made from an older version of one of their inputs.",
    )
    parser.add_argument("paths", nargs="*", default=["results"], help="files or folders (default: results)")
    lines = stale(parser.parse_args(argv).paths)
    print("\n".join(lines) if lines else "every file was made from the inputs there now")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
