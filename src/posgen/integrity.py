"""Integrity of posgen's files: content digests (written with the data, checked on every read), the one-line
error of a damaged or edited file with the command that remakes it, and the lineage that tells which outputs were
made from an older version of their inputs, directly or through another output (``python -m posgen.integrity
[DIR ...]``; docs/data-model.md, "Checksums and digests"). No xarray or torch here: the check runs anywhere.

Lineage: every file a workflow job writes records the content digests of the files the job read, as a global
attr in a .nc/.h5 file (:data:`INPUTS_ATTR`), beside any other file (a table, a figure, a report) as a small JSON
record under :data:`LINEAGE_DIR` (:func:`lineage_record`). Snakemake decides by modification times; the records
decide by content, so a copy that kept an old mtime (``cp -p``, ``rsync -a``) is still found, and a file remade with
the same content need not remake what was made from it (``--settle-unchanged``)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from posgen.paths import RESULTS, identity
from posgen.snakemake_records import INCOMPLETE_DIR, incomplete_files


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


# Global attr of every per-job .nc/.h5 (posgen.paths.IDENTIFIED): JSON of what the file is, from the path it was
# written to (posgen.paths.identity: paper, file name, model, variant, shard; experiment, task, pe, seed; dataset;
# collection), checked against the path it is read from, so that a valid file in another's place is refused.
IDENTITY_ATTR = "posgen_identity"
# attrs that named a file's model, variant or classifier before IDENTITY_ATTR existed: checked in its absence
LEGACY_IDENTITY = ("model", "variant", "experiment", "task", "pe", "seed")
IDENTITY_ORDER = ("model", "variant", "shard", "experiment", "task", "pe", "seed", "dataset", "collection")


def identity_attr(path: str | Path) -> str | None:
    """:data:`IDENTITY_ATTR` of a file written to ``path``; None where the path says nothing."""
    found = identity(path)
    return None if found is None else json.dumps(found, sort_keys=True)


def _text(value) -> str:
    """An attr as text, whatever numpy type h5py gives it (netCDF stores a number as an array of one)."""
    value = np.asarray(value)
    value = value.reshape(()).item() if value.size == 1 else value.tolist()
    return value.decode() if isinstance(value, bytes) else str(value)


def described(found: dict) -> str:
    """What an identity says, in words: ``the train.nc of experiment clean, task distance, pe rope, seed 0``."""
    keys = ", ".join(f"{key} {found[key]}" for key in IDENTITY_ORDER if key in found)
    name = found.get("file", "file")
    return f"the {name} of {keys}" if keys else f"the {name}"


def check_identity(path: str | Path, attrs) -> None:
    """Refuse, in one line naming ``path``, a file whose recorded identity (``attrs``, its global attrs) is not the
    one its path says (another classifier's, variant's, shard's or collection's file in its place); a file written
    before :data:`IDENTITY_ATTR` is checked on its own model, variant and classifier attrs."""
    expected = identity(path)
    if expected is None:
        return
    if IDENTITY_ATTR in attrs:
        try:
            claimed = json.loads(_text(attrs[IDENTITY_ATTR]))
        except ValueError:
            claimed = None
        if not isinstance(claimed, dict):
            raise damaged(path, f"its attribute {IDENTITY_ATTR} is not a JSON object ({EDITED})")
        claimed = {key: _text(value) for key, value in claimed.items()}
    else:
        legacy = {key: _text(attrs[key]) for key in LEGACY_IDENTITY if key in expected and key in attrs}
        claimed = {"file": expected["file"], **legacy}
        expected = {key: value for key, value in expected.items() if key in claimed}
    differ = [key for key in {**expected, **claimed} if claimed.get(key) != expected.get(key)]
    if differ:
        says = ", ".join(f"{key} {expected[key]}" if key in expected else f"no {key}" for key in differ)
        raise damaged(path, f"another file in its place: it is {described(claimed)} (its path: {says})")


def check_rows(path: str | Path, columns: dict) -> None:
    """Refuse, in one line naming ``path``, a table (a per-model CSV) whose rows are of another model than its path
    says: ``columns`` maps a column to its values, checked where the path names that column's key."""
    expected = identity(path) or {}
    for key, values in columns.items():
        others = sorted({str(value) for value in values} - {expected[key]}) if key in expected else []
        if others:
            raise damaged(
                path,
                f"another file in its place: its rows are of {key} {', '.join(others)} (its path: "
                f"{key} {expected[key]})",
            )


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


def table_digest(table) -> str:
    """The content digest of a table as pandas reads it back: per column, the CRC-32 of its values (numbers as their
    bytes, anything else as text), combined as a file's variables are (posgen.integrity.content_digest)."""
    digests = {}
    for name in table.columns:
        values = table[name].to_numpy()
        if values.dtype.kind in "biuf":
            digests[str(name)] = digest(np.ascontiguousarray(values))
        else:
            digests[str(name)] = digest(np.frombuffer("\x1f".join(map(str, values)).encode(), dtype=np.uint8))
    return content_digest(digests)


def parquet_metadata(path) -> dict[str, str]:
    """A Parquet table's key-value metadata as text (read without its data); one line naming a file that is not
    Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        found = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError) as err:
        raise damaged(path, f"not a Parquet table ({str(err).splitlines()[0]})") from None
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in found.items()}


def verified_table(path):
    """A posgen Parquet table (posgen.parquet) read whole and checked: its identity, its content digest (present,
    and equal to the table's), its pages' checksums; one line naming the file and the command that remakes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    recorded = parquet_metadata(path)
    check_identity(path, recorded)
    if CONTENT_ATTR not in recorded:
        raise damaged(path, "no posgen digest in its metadata (written by another writer, or before posgen kept one)")
    try:
        table = pq.read_table(path, page_checksum_verification=True).to_pandas()
    except (pa.ArrowException, OSError) as err:
        raise damaged(path, f"unreadable ({str(err).splitlines()[0]})") from None
    if table_digest(table) != recorded[CONTENT_ATTR]:
        raise damaged(path, EDITED)
    return table


def record_inputs(paths) -> None:
    """The files the running job reads (its rule's inputs): every output it writes records their digests."""
    _job_inputs[:] = [Path(p) for p in paths]


@contextmanager
def made_from(paths):
    """Within the block, what the running job writes records only ``paths`` among the job's inputs: a job that writes
    several files, each from part of what it read. Outside a workflow job nothing is recorded either way."""
    saved = list(_job_inputs)
    wanted = {shown(p) for p in paths if p is not None}
    _job_inputs[:] = [p for p in saved if shown(p) in wanted]
    try:
        yield
    finally:
        _job_inputs[:] = saved


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
    """What a file's digest is now: a posgen file's content digest (a .nc/.h5 global attr or a Parquet table's
    metadata, read without its data), else the CRC-32 of a small file's bytes (a manifest, a CSV); None for a
    missing, large or unreadable file."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.suffix in (".nc", ".h5"):
        return _file_attr(path, CONTENT_ATTR)
    if path.suffix == ".parquet":  # its recorded content digest; None for a table without one
        try:
            return parquet_metadata(path).get(CONTENT_ATTR)
        except OSError:
            return None
    if path.stat().st_size > 64 * 2**20:
        return None
    return f"{zlib.crc32(path.read_bytes()):08x}"


def input_digests() -> str:
    """:data:`INPUTS_ATTR` of an output the running job writes: JSON of ``{path: digest}`` of its inputs."""
    return json.dumps({shown(p): current_digest(p) for p in _job_inputs if Path(p).is_file()}, sort_keys=True)


# Lineage of the files that cannot hold an attr (tables, figures, reports): <LINEAGE_DIR>/<path>.json, relative to
# the working directory (Snakemake's --directory), written by the job that writes the file.
LINEAGE_DIR = Path(".posgen/lineage")
HDF5 = (".nc", ".h5")


def lineage_record(path: str | Path) -> Path | None:
    """Where the lineage of ``path`` (not a .nc/.h5 file) is kept; None for a file outside the working directory."""
    relative = Path(shown(path))
    return None if relative.is_absolute() or relative.parts[:1] == ("..",) else LINEAGE_DIR / f"{relative}.json"


def record_lineage(path: str | Path) -> None:
    """Record, beside a table, figure or report the running job has just written, the digests of the job's
    inputs (a .nc/.h5 file holds them itself; outside a workflow job there is nothing to record)."""
    record = lineage_record(path)
    if not _job_inputs or Path(path).suffix in HDF5 or record is None:
        return
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(input_digests())
        os.replace(tmp, record)
    except OSError as err:  # the file itself is written: a lineage that cannot be kept is unknown, not an error
        tmp.unlink(missing_ok=True)
        print(f"{shown(record)}: cannot record the lineage of {shown(path)} ({err.strerror or err})", file=sys.stderr)


class DamagedRecord(ValueError):
    """A lineage record that cannot be read: its file, what holds it (a record under .posgen/lineage/ or the file's
    own attr) and what to do, in one line."""


def recorded_inputs(path: Path) -> dict | None:
    """``{input: digest}`` the job that wrote ``path`` recorded, or None where nothing was recorded; a damaged
    record (not a JSON object of digests) raises :class:`DamagedRecord`."""
    if path.suffix in HDF5:
        where, text = f"its attribute {INPUTS_ATTR}", _file_attr(path, INPUTS_ATTR)
    else:
        record = lineage_record(path)
        where = f"its lineage record {shown(record)}" if record is not None else ""
        text = record.read_text(errors="replace") if record is not None and record.is_file() else None
    if text is None:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(isinstance(d, (str, type(None))) for d in found.values()):
        raise DamagedRecord(
            f"{shown(path)}: {where} is damaged (not the JSON object of input digests posgen writes), so what it was "
            f"made from is unknown; remake it to record it again: snakemake --cores all {shown(path)} --forcerun "
            f"{shown(path)} (with the run's own --configfile, if it had one)"
        )
    return found


def _files(paths) -> list[Path]:
    """Every file among ``paths`` (files, or folders searched to any depth), hidden ones left out."""
    files = []
    for path in map(Path, paths):
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [p for p in files if p.name[:1] != "."]


def _lineage(paths, damaged_records: dict | None = None) -> dict[str, dict]:
    """``{file: recorded inputs}`` of every file among ``paths`` (files or folders) that records its inputs; a file
    whose record is damaged goes to ``damaged_records`` ({file: one line}) instead."""
    records = {}
    for path in _files(paths):
        try:
            records[shown(path)] = recorded_inputs(path)
        except DamagedRecord as err:
            if damaged_records is not None:
                damaged_records[shown(path)] = str(err)
    return {name: inputs for name, inputs in records.items() if inputs is not None}


def damaged_tables(paths) -> dict[str, str]:
    """{Parquet table: one line} of every posgen Parquet table among ``paths`` that does not read back whole
    (:func:`verified_table`: damaged pages, edited data, another table in its place, no digest)."""
    found = {}
    for path in _files(paths):
        if path.suffix == ".parquet":
            try:
                verified_table(path)
            except OSError as err:
                found[shown(path)] = str(err)
    return found


def out_of_date(paths, records: dict[str, dict] | None = None) -> dict[str, tuple[str, str]]:
    """``{file: (input, why)}`` for every file among ``paths`` made from another version of one of its inputs than
    the one there now, from an input that is gone, or from a file that is itself out of date (to any depth).
    ``records``: their :func:`_lineage`, where the caller has read it already."""
    records = _lineage(paths) if records is None else records
    found = {}
    for name, inputs in records.items():
        for source, then in sorted(inputs.items()):
            now = current_digest(Path(source))
            if then is not None and now != then:
                found[name] = (source, "is gone" if now is None and not Path(source).exists() else "has changed since")
                break
    grown = True
    while grown:  # second-order dependants: made from a file that is out of date
        grown = False
        for name, inputs in records.items():
            source = next((s for s in sorted(inputs) if s in found), None)
            if name not in found and source is not None:
                found[name] = (source, "is itself out of date")
                grown = True
    return found


# A printed remake command longer than this reads its files from `python -m posgen.integrity` itself
HINT_LIMIT = 300


def remake_files(found: dict[str, tuple[str, str]], records: dict[str, dict]) -> tuple[list[str], list[str]]:
    """(forced, targets) of the out-of-date files ``found`` (:func:`out_of_date` over ``records``): those made
    directly from an input that changed or is gone, whose jobs Snakemake must be forced to rerun (their mtimes may
    say they are up to date), and those nothing out of date was made from, which Snakemake then remakes with every
    file between."""
    forced = sorted(name for name, (_, why) in found.items() if why != "is itself out of date")
    read = {source for name in found for source in records.get(name, {})}
    return forced, sorted(name for name in found if name not in read)


def remake_hint(forced: list[str], targets: list[str], paths=()) -> str:
    """The one command that remakes what :func:`remake_files` lists: the files themselves where the command is short
    (:data:`HINT_LIMIT`), else read from this module (``--targets``, ``--forced``) over the same ``paths``."""
    command = f"snakemake --cores all {shlex.join(targets)} --forcerun {shlex.join(forced)}"
    if len(command) > HINT_LIMIT:
        listed = shlex.join(["python", "-m", "posgen.integrity", *(str(p) for p in paths if str(p) != RESULTS)])
        command = f"snakemake --cores all $({listed} --targets) --forcerun $({listed} --forced)"
    return f"{command} (with the run's own --configfile, if it had one)"


def findings(paths) -> tuple[dict, dict, list[str], list[str]]:
    """(damaged: {file: one line}, out of date: :func:`out_of_date`, forced, targets) among ``paths``: the damaged
    Parquet tables (:func:`damaged_tables`) and lineage records are forced and targeted with the out-of-date files."""
    broken: dict[str, str] = {}
    records = _lineage(paths, broken)
    broken.update(damaged_tables(paths))
    found = out_of_date(paths, records)
    forced, targets = remake_files(found, records)
    return broken, found, sorted({*forced, *broken}), sorted({*targets, *broken})


def stale(paths) -> list[str]:
    """One line per damaged file and out-of-date file among ``paths`` (:func:`findings`), then the one short command
    that remakes them all (:func:`remake_hint`)."""
    broken, found, forced, targets = findings(paths)
    lines = [broken[name] for name in sorted(broken)]
    lines += [f"{name}: made from {source}, which {why}" for name, (source, why) in sorted(found.items())]
    return lines + [f"remake them: {remake_hint(forced, targets, paths)}"] if lines else []


def _inputs_first(records: dict[str, dict]) -> list[str]:
    """The files of ``records`` ordered so that a file comes after every recorded file it was made from."""
    order, done = [], set()
    pending = sorted(records)
    while pending:
        ready = [n for n in pending if all(s not in records or s in done or s == n for s in records[n])]
        ready = ready or pending[:1]  # a workflow has no cycles; never loop forever on a hand-made one
        order += ready
        done.update(ready)
        pending = [n for n in pending if n not in done]
    return order


def settle_unchanged(paths) -> list[str]:
    """Give every file among ``paths`` that was remade with the content its dependants were made from (their
    recorded digests of it are its digest now) but is newer than one of them an mtime 1 ms after its newest input,
    inputs first, so that Snakemake (which goes by mtimes) does not remake them; a file with no recorded inputs of
    its own (a task's data) 1 ms before the oldest file made from it. A file made from other content is left as it
    is. Returns the files settled."""
    records = _lineage(paths)
    found = out_of_date(paths, records)
    readers: dict[str, list[str]] = {}  # file -> the up-to-date files made from it
    for name, inputs in records.items():
        for source in inputs if name not in found else ():
            readers.setdefault(source, []).append(name)
    settled = []
    for name in _inputs_first(records):
        path = Path(name)
        if name in found or not path.is_file():
            continue
        mtime = path.stat().st_mtime_ns
        if not any(Path(r).is_file() and Path(r).stat().st_mtime_ns < mtime for r in readers.get(name, [])):
            continue  # nothing made from it looks older to Snakemake
        newest = max((Path(s).stat().st_mtime_ns for s in records[name] if Path(s).is_file()), default=None)
        if newest is None or newest + 1_000_000 >= mtime:
            continue
        os.utime(path, ns=(newest + 1_000_000, newest + 1_000_000))
        settled.append(name)
    for name in sorted(n for n in readers if not records.get(n)):  # made from no recorded input (task data)
        path, made = Path(name), [Path(r) for r in readers[name] if Path(r).is_file()]
        if not path.is_file() or not made or not _under(path, paths):
            continue
        oldest = min(r.stat().st_mtime_ns for r in made)
        if path.stat().st_mtime_ns > oldest:  # its readers recorded its content now: 1 ms before the oldest
            os.utime(path, ns=(oldest - 1_000_000, oldest - 1_000_000))
            settled.append(name)
    return settled


def _under(path: Path, paths) -> bool:
    """Whether ``path`` is one of ``paths`` or lies in one of them (a folder)."""
    resolved = path.resolve()
    return any(resolved == Path(p).resolve() or Path(p).resolve() in resolved.parents for p in paths)


def incomplete() -> list[str]:
    """One line per output Snakemake marks incomplete (its "Incomplete files", which a rerun refuses until told
    ``--rerun-incomplete``): whether it is there (then whole: posgen renames a file into place only once written)
    and made from the inputs there now; then what to run."""
    names = sorted(incomplete_files())
    if not names:
        return []
    found = out_of_date([name for name in names if Path(name).is_file()])
    lines = []
    for name in names:
        if not Path(name).is_file():
            lines.append(f"{name}: not there (its job was killed before it wrote it)")
        elif name in found:
            source, why = found[name]
            lines.append(f"{name}: there and whole, but made from {source}, which {why}")
        else:
            try:
                made = ", made from the inputs there now" if recorded_inputs(Path(name)) is not None else ""
            except DamagedRecord as err:
                made = f" ({err})"
            lines.append(f"{name}: there and whole{made}")
    lines.append(
        "Snakemake marks these incomplete because the job writing them was killed before it ended; redo that job "
        "with: snakemake --cores all --rerun-incomplete (with the run's own --configfile, if it had one; after "
        "snakemake --unlock if the run was killed)"
    )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posgen.integrity",
        description="List the posgen files made from an older version of one of their inputs, directly or through "
        "another file, and the command that remakes them.",
    )
    parser.add_argument("paths", nargs="*", default=[RESULTS], help=f"files or folders (default: {RESULTS})")
    listing = parser.add_mutually_exclusive_group()
    listing.add_argument("--targets", action="store_true", help="print only the files the remake command targets")
    listing.add_argument("--forced", action="store_true", help="print only the files it forces Snakemake to remake")
    listing.add_argument(
        "--incomplete",
        action="store_true",
        help="list the files Snakemake marks incomplete (a killed run), whether each is whole, and what to run",
    )
    listing.add_argument(
        "--settle-unchanged",
        action="store_true",
        help="first give every file remade with the content its dependants were made from an mtime just after "
        "its inputs', so that Snakemake does not remake them",
    )
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing and not args.incomplete:
        print(f"{', '.join(missing)}: no such file or folder (run from the run's working directory)", file=sys.stderr)
        return 2
    if args.settle_unchanged:
        settled = settle_unchanged(args.paths)
        print(f"{len(settled)} files remade with unchanged content settled: {' '.join(settled) or '-'}")
    if args.incomplete:
        lines = incomplete()
        print("\n".join(lines) if lines else f"Snakemake marks no file incomplete here ({INCOMPLETE_DIR})")
        return 1 if lines else 0
    if args.targets or args.forced:
        _, _, forced, targets = findings(args.paths)
        print(" ".join(forced if args.forced else targets))
        return 0
    lines = stale(args.paths)
    print("\n".join(lines) if lines else "every file was made from the inputs there now")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
