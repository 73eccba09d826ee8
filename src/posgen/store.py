"""HDF5/netCDF storage with named dimensions, atomic writes and provenance attrs."""

from __future__ import annotations

import datetime as _dt
import errno
import importlib.metadata
import json
import os
import shutil
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5netcdf
import h5py
import numpy as np
import xarray as xr

from posgen.integrity import (
    ATTRS_ATTR,
    BLOCK_DIGEST_ATTR,
    CONTENT_ATTR,
    DIGEST_ATTR,
    EDITED,
    IDENTITY_ATTR,
    INPUTS_ATTR,
    StoreError,
    attrs_digest,
    check_identity,
    content_digest,
    damaged,
    digest,
    identity_attr,
    input_digests,
    record_lineage,
    shown,
    verified_read,
)
from posgen.rope_table import ROPE_VARIABLES, RopeTable
from posgen.termination import refuse_if_terminated
from posgen.version import VERSION

# storage dtypes of q/k in qk.h5 (HDF5 and NetCDF have no bfloat16)
QK_DTYPES = ("float32", "float16")
# qk.h5's coefficients of the mean key at every position over the held-out windows on Method A-drift's smooth basis
# (layer, kv_head, basis, dim), float64: Method A-shared's source, which reads the mean only through that fit
# (docs/method.md section 3C; posgen.decomposition.drift.heldout_coefficients); the count of windows is the
# attribute ``heldout_windows``. Files written before it hold the mean itself, HELDOUT_MEAN (layer, kv_head, token,
# dim), float32: 0.54 GB a shard for the Llama-3.1-8B shape at 4,096 tokens, against 2.4 MB of coefficients.
HELDOUT_COEF = "k_heldout_coef"
HELDOUT_MEAN = "k_heldout_mean"

# attrs of qk.h5 (the model, its weights and the capture) that every output derived from it carries
CARRIED_ATTRS = (
    "model",
    "model_source",
    "model_revision",
    "weights_sha256",
    "variant",
    "init_seed",
    "architecture",
    "capture_point",
    "softcap",
    "dtype",
    "first_token",
)


def _version(package: str) -> str:
    """Installed version of ``package`` from its metadata: recording it imports nothing (no torch in figure jobs)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def provenance(**extra) -> dict:
    """Attrs every posgen output carries: library versions, time, plus the caller's own keys."""
    attrs = {
        "posgen_version": VERSION,
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "xarray_version": xr.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    for key, value in extra.items():
        if isinstance(value, str):
            attrs[key] = str(value)  # numpy str_ has no HDF5 type
        elif isinstance(value, (bool, np.bool_)):
            attrs[key] = int(value)
        elif isinstance(value, (int, float, np.number)):
            attrs[key] = value
        else:
            attrs[key] = json.dumps(value, default=str)
    return attrs


def stable_provenance(**extra) -> dict:
    """:func:`provenance` without the creation time, for outputs that must stay byte-identical (figures, tables)."""
    attrs = provenance(**extra)
    attrs.pop("created", None)
    return attrs


def carried_attrs(ds: xr.Dataset | dict) -> dict:
    """The :data:`CARRIED_ATTRS` that ``ds`` (a dataset, or qk.h5's attrs) has, to copy into an output derived
    from it."""
    attrs = ds if isinstance(ds, dict) else ds.attrs
    return {key: attrs[key] for key in CARRIED_ATTRS if key in attrs}


def require(ds: xr.Dataset | xr.DataArray, names, what: str) -> None:
    """Fail with one line naming ``what`` (a file, or its role) and every variable or dim of ``names`` it lacks."""
    have = set(ds.dims) | set(ds.coords) | (set(ds.data_vars) if isinstance(ds, xr.Dataset) else set())
    missing = [name for name in names if name not in have]
    if missing:
        raise KeyError(f"{what}: missing {', '.join(missing)}")


def _read_failure(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "filter returned failure" in text or "checksum" in text.lower():
        return "data fail their checksum (Fletcher-32) or decompression, the file is corrupted"
    return f"cannot read its data ({text})"


def _name_the_file_on_read_errors() -> None:
    """xarray reads variables lazily, deep inside its indexing (and dask): an h5py error there (a checksum
    mismatch, a truncated file) names neither the file nor the variable. Wrap the one method every h5netcdf
    read goes through so that it does."""
    try:
        from xarray.backends.h5netcdf_ import H5NetCDFArrayWrapper

        read = H5NetCDFArrayWrapper._getitem
    except (ImportError, AttributeError):  # another xarray: errors then lack the path, nothing else changes
        return
    if getattr(read, "posgen_wrapped", False):
        return

    def _getitem(self, key):
        try:
            return verified_read(self, key, read)
        except OSError as err:  # what h5py raises for a failed checksum or a missing/garbled block
            if isinstance(err, StoreError):
                raise
            path = self.datastore._filename
            raise damaged(path, f"variable {self.variable_name}: {_read_failure(err)}") from None

    _getitem.posgen_wrapped = True
    H5NetCDFArrayWrapper._getitem = _getitem


_name_the_file_on_read_errors()


def sweep_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporaries of ``path`` (``.<name>.<pid>.tmp``) left by a killed job whose pid is gone.

    A SIGKILL (or a node failure) runs no cleanup; the next job writing the same output sweeps them. A
    temporary of a live process (another job on the same output) is kept.
    """
    path = Path(path)
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a temporary whose writer is gone may be swept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# What a failed write says, by errno, and by the words h5py and torch put in their own messages
WRITE_FAILURES = {
    errno.ENOSPC: ("no space left on device", "No space left on device"),
    errno.EDQUOT: ("disk quota exceeded", "Disk quota exceeded"),
    errno.EACCES: ("permission denied", "Permission denied"),
    errno.EPERM: ("permission denied", "Operation not permitted"),
    errno.EROFS: ("read-only file system", "Read-only file system"),
}


def write_failure(err: BaseException) -> str | None:
    """``no space left on device`` (etc.) when ``err`` is a write failing for want of room or rights, else None."""
    if getattr(err, "errno", None) in WRITE_FAILURES:
        return WRITE_FAILURES[err.errno][0]
    text = str(err)
    for code, (words, marker) in WRITE_FAILURES.items():
        if marker in text or f"errno = {code}," in text:  # h5py: "... errno = 28, error message = ..."
            return words
    return None


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary sibling path; rename it to ``path`` only if the block succeeds.

    A killed or failed job therefore never leaves a file that looks complete, and an existing finished
    file is only replaced by a complete new one. A write that fails for want of room or rights (a full disk,
    a quota, a folder one may not write, a read-only file system) is one line naming ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_temporaries(path)
        yield tmp
        refuse_if_terminated()  # a job asked to stop never publishes, even if its SystemExit was swallowed
        os.replace(tmp, path)
        record_lineage(path)
    except (OSError, RuntimeError) as err:  # torch's zip writer words a full disk as a RuntimeError
        reason = None if isinstance(err, StoreError) else write_failure(err)
        if reason is None:
            raise
        raise StoreError(f"{shown(path)}: cannot write ({reason})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
            print(f"removed {shown(tmp)}, the unfinished temporary of {shown(path)}", file=sys.stderr)


def size_text(n_bytes: int) -> str:
    """``n_bytes`` in words with three significant digits: ``512 bytes``, ``41.3 kB``, ``2.71 GB``."""
    if n_bytes < 1000:
        return f"{n_bytes} bytes"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        text = f"{n_bytes / scale:.3g}"
        if float(text) < 1000:
            return f"{text} {unit}"
    return f"{n_bytes / 1e12:,.0f} TB"


def require_space(path: str | Path, n_bytes: int) -> None:
    """Refuse, in one line naming ``path``, a write of ``n_bytes`` that its file system has no room for (bytes, or a
    file to hold them: a disk full of small files runs out of inodes first): checked before a large write whose
    size is known (qk.h5, checkpoints), so that a job does not compute for hours to fail at its last step. The
    numbers are shown as they are, in bytes where rounding would make them look the same."""
    path = Path(path)
    folder = next(parent for parent in (path.parent, *path.parent.parents) if parent.exists())
    free = shutil.disk_usage(folder).free
    where = shown(folder)
    if n_bytes > free:
        needs, has = size_text(n_bytes), size_text(free)
        if needs == has:
            needs, has = f"{n_bytes:,} bytes", f"{free:,} bytes"
        raise StoreError(f"{shown(path)}: cannot write (needs {needs}, {has} free on {where})")
    stats = os.statvfs(folder)
    if stats.f_files and not stats.f_favail:  # a file system with inodes, every one in use
        raise StoreError(
            f"{shown(path)}: cannot write (no file can be created: 0 of {stats.f_files:,} inodes free on {where})"
        )


def write_netcdf(ds: xr.Dataset, path: str | Path, compression: int = 1) -> None:
    """Write ``ds`` atomically with h5netcdf, gzip-compressing every numeric variable and storing its
    Fletcher-32 checksum (HDF5 verifies it on every read)."""
    packed = {"zlib": True, "complevel": compression, "shuffle": True} if compression else {}
    encoding = {
        name: {**packed, "fletcher32": True}
        for name, var in ds.data_vars.items()
        if var.dtype.kind in "fiu" and var.ndim > 0 and var.size > 0  # an empty variable has no chunk to check
    }
    ds = with_identity(with_digests(ds), path)
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp, engine="h5netcdf", encoding=encoding)
        with h5py.File(tmp, "r+") as f:  # the attrs digest of what was stored, as a reader will see it
            f.attrs[ATTRS_ATTR] = attrs_digest(f.attrs)


def with_digests(ds: xr.Dataset) -> xr.Dataset:
    """A shallow copy of ``ds`` whose numeric data variables carry the digest of the bytes they will be stored as
    (:data:`DIGEST_ATTR`; their encodings inherited from a file read earlier are dropped, so that the stored bytes
    are these), no variable a digest inherited from another file, and the dataset its content digest and the
    digests of the running job's inputs (:data:`CONTENT_ATTR`, :data:`INPUTS_ATTR`)."""
    ds = ds.copy(deep=False)
    digests = {}
    for name, var in ds.variables.items():
        for attr in (DIGEST_ATTR, BLOCK_DIGEST_ATTR):
            var.attrs.pop(attr, None)
        if var.dtype.kind in "fiu" and var.size > 0:  # data and coordinates alike
            var.encoding = {}
            var.attrs[DIGEST_ATTR] = digests[name] = digest(var.values)
    ds.attrs = {**ds.attrs, CONTENT_ATTR: content_digest(digests), INPUTS_ATTR: input_digests()}
    return ds


def with_identity(ds: xr.Dataset, path: str | Path) -> xr.Dataset:
    """A shallow copy of ``ds`` whose attrs say what the file at ``path`` is (:data:`IDENTITY_ATTR`, from the path),
    none inherited from a file read earlier."""
    ds = ds.copy(deep=False)
    ds.attrs = {key: value for key, value in ds.attrs.items() if key != IDENTITY_ATTR}
    found = identity_attr(path)
    if found:
        ds.attrs[IDENTITY_ATTR] = found
    return ds


def open_dataset(path: str | Path, lazy: bool = True) -> xr.Dataset:
    """Open a posgen file with its named dims; ``lazy`` maps on-disk chunks to dask chunks. A per-job file must be
    the one its path names (posgen.integrity.check_identity): another's in its place is refused in one line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{shown(path)}: no such file")
    if path.is_dir():
        raise IsADirectoryError(f"{shown(path)}: is a directory, not a posgen file")
    ds = None
    try:
        ds = xr.open_dataset(path, engine="h5netcdf", chunks={} if lazy else None)
        with h5py.File(path, "r") as f:
            recorded = f.attrs.get(ATTRS_ATTR)
            if recorded is not None and attrs_digest(f.attrs) != np.asarray(recorded).tolist():
                raise damaged(path, f"its attributes: {EDITED}")
            check_identity(path, f.attrs)  # another classifier's, variant's or shard's file in its place
        return ds
    except StoreError:
        if ds is not None:
            ds.close()
        raise
    except OSError as err:
        # h5py words a truncated or overwritten file as a ~25-frame traceback without the path
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise damaged(path, f"not a readable HDF5/netCDF file ({text})") from None


def read_rope(ds: xr.Dataset) -> RopeTable:
    """The RoPE table of a qk.h5 dataset (:class:`QKWriter` writes it); a store without layout variables has the
    canonical layout. Arrays are copies: changing one leaves ``ds`` alone."""
    present = {name: np.array(ds[name].values) for name in ROPE_VARIABLES if name in ds}
    return RopeTable(**present)


def rope_variables(rope: RopeTable) -> dict:
    """qk.h5's variables of a RoPE table: name -> (dims, array), in the order :class:`QKWriter` writes them."""
    return {name: (dims, getattr(rope, name)) for name, (dims, _) in ROPE_VARIABLES.items()}


def qk_dataset(q: np.ndarray, k: np.ndarray, token_id: np.ndarray, rope: RopeTable, samples, attrs: dict) -> xr.Dataset:
    """qk.h5's windows as a dataset in memory, named as :class:`QKWriter` writes them (docs/data-model.md; no
    reference logits): q (sample, layer, head, token, dim), k (sample, layer, kv_head, token, dim), token_id
    (sample, token), the RoPE table; ``samples`` the windows' global indices; ``attrs`` added to the provenance."""
    n_samples, n_layers, n_heads, n_tokens, head_dim = q.shape
    coords = {
        "sample": np.asarray(samples, dtype=np.int64),
        "layer": np.arange(n_layers),
        "head": np.arange(n_heads),
        "kv_head": np.arange(k.shape[2]),
        "token": np.arange(n_tokens),
        "dim": np.arange(head_dim),
        "band": np.arange(head_dim // 2),
    }
    data = {
        "q": (("sample", "layer", "head", "token", "dim"), q),
        "k": (("sample", "layer", "kv_head", "token", "dim"), k),
        "token_id": (("sample", "token"), np.asarray(token_id, dtype=np.int64)),
        **rope_variables(rope),
    }
    return xr.Dataset(data, coords=coords, attrs=provenance(qk_dtype=q.dtype.name, **attrs))


@dataclass(frozen=True)
class QKLayout:
    """What qk.h5 holds and how it is stored (:class:`QKWriter`'s one argument besides the RoPE table and the attrs):
    the windows, the model's shapes, the windows and layers whose reference logits it keeps, the gzip level (0: none)
    and the storage dtype of q/k."""

    samples: Sequence[int]  # the windows' global indices, in file order
    n_layers: int
    n_heads: int
    n_kv_heads: int
    n_tokens: int
    head_dim: int
    ref_samples: Sequence[int]
    ref_layers: Sequence[int]
    compression: int = 0
    qk_dtype: str = "float32"

    def __post_init__(self):
        if self.qk_dtype not in QK_DTYPES:
            raise ValueError(f"extract.qk_dtype: {self.qk_dtype!r} is not one of {', '.join(QK_DTYPES)}")

    def stored_bytes(self) -> int:
        """The file's size uncompressed, checked against the free space before a write: q and k of every kept
        window, and the reference logits (float32) of the reference windows it keeps."""
        samples = np.asarray(self.samples, dtype=np.int64).tolist()
        window_values = self.n_layers * (self.n_heads + self.n_kv_heads) * self.n_tokens * self.head_dim
        qk_bytes = len(samples) * window_values * np.dtype(self.qk_dtype).itemsize
        n_refs = len(set(self.ref_samples) & set(samples))
        return qk_bytes + n_refs * len(self.ref_layers) * self.n_heads * self.n_tokens**2 * 4

    def filters(self) -> dict:
        """The HDF5 filters of the chunked variables: gzip where asked, and the Fletcher-32 checksum that HDF5
        verifies on every chunk it reads (a changed byte fails loudly)."""
        if not self.compression:
            return {"fletcher32": True}
        return {"compression": "gzip", "compression_opts": self.compression, "shuffle": True, "fletcher32": True}


class QKWriter:
    """Writes ``qk.h5`` one sample at a time (see docs/data-model.md).

    Use as a context manager: the file appears under its final name only after ``close`` succeeds.
    """

    def __init__(self, path: str | Path, layout: QKLayout, *, rope: RopeTable, attrs: dict):
        self.path = Path(path)
        self.samples = np.asarray(layout.samples, dtype=np.int64)  # the windows' global indices, in file order
        self.qk_dtype = np.dtype(layout.qk_dtype)
        if not layout.compression:  # the size is known
            require_space(self.path, layout.stored_bytes())
        self._atomic = atomic_path(self.path)
        tmp = self._atomic.__enter__()
        # only the reference windows this file holds
        self.ref_samples = [int(s_) for s_ in layout.ref_samples if s_ in set(self.samples.tolist())]
        self.ref_layers = list(layout.ref_layers)
        self.file = h5netcdf.File(tmp, "w")
        self._write_dimensions(layout)
        self._create_blocks(layout)
        self.whole = {}  # the digests of the variables written whole, by name
        self._write_rope(rope)
        self._write_attrs(attrs)
        self.written = np.zeros(len(self.samples), dtype=bool)
        self.closed = False

    def _write_dimensions(self, layout: QKLayout) -> None:
        """Every dimension of the file, each with its coordinate (the windows' and reference layers' own indices,
        0, 1, ... for the others)."""
        coords = {
            "sample": self.samples,
            "layer": np.arange(layout.n_layers),
            "head": np.arange(layout.n_heads),
            "kv_head": np.arange(layout.n_kv_heads),
            "token": np.arange(layout.n_tokens),
            "dim": np.arange(layout.head_dim),
            "band": np.arange(layout.head_dim // 2),
            "ref_sample": np.asarray(self.ref_samples),
            "ref_layer": np.asarray(self.ref_layers),
            "query": np.arange(layout.n_tokens),
            "key": np.arange(layout.n_tokens),
        }
        self.file.dimensions = {dim: len(values) for dim, values in coords.items()}
        for dim, values in coords.items():
            self.file.create_variable(dim, (dim,), "i8", data=values)

    def _create_blocks(self, layout: QKLayout) -> None:
        """q, k, token_id and the reference logits, empty, the first three with the digest of each block beside
        them. One chunk per (sample, layer): the unit every reader works on, and the block of its digest."""
        n_tokens, head_dim, packed = layout.n_tokens, layout.head_dim, layout.filters()
        q_dims = ("sample", "layer", "head", "token", "dim")
        self.q = self._chunked("q", q_dims, self.qk_dtype, (1, 1, layout.n_heads, n_tokens, head_dim), packed)
        k_dims = ("sample", "layer", "kv_head", "token", "dim")
        self.k = self._chunked("k", k_dims, self.qk_dtype, (1, 1, layout.n_kv_heads, n_tokens, head_dim), packed)
        self.token_id = self.file.create_variable("token_id", ("sample", "token"), "i8")
        ref_dims = ("ref_sample", "ref_layer", "head", "query", "key")
        self.logits_ref = self._chunked("logits_ref", ref_dims, "f4", (1, 1, 1, n_tokens, n_tokens), packed)
        self.digests = {
            "q": self._block_digests(self.q, ("sample", "layer")),
            "k": self._block_digests(self.k, ("sample", "layer")),
            "logits_ref": self._block_digests(self.logits_ref, ("ref_sample", "ref_layer")),
        }

    def _chunked(self, name: str, dims: tuple, dtype, chunks: tuple, packed: dict):
        """Variable ``name`` stored in ``chunks`` with the ``packed`` filters; HDF5 cannot chunk an empty
        dimension: a file that keeps no window holds its metadata only."""
        empty = any(self.file.dimensions[dim].size == 0 for dim in dims)
        return self.file.create_variable(name, dims, dtype, **({} if empty else {"chunks": chunks, **packed}))

    def _block_digests(self, var, block_dims: tuple):
        """The variable holding the digest of each block of ``var`` (every other dim whole), written with the block
        (integrity.BLOCK_DIGEST_ATTR); -1 until it is."""
        var.attrs[BLOCK_DIGEST_ATTR] = " ".join(block_dims)
        return self.file.create_variable(f"{var.name.lstrip('/')}_digest", block_dims, "i8", fillvalue=-1)

    def _write_attrs(self, attrs: dict) -> None:
        """The provenance with the caller's ``attrs``, what the file is (from its path) and the job's inputs."""
        self.file.attrs.update(provenance(qk_dtype=self.qk_dtype.name, **attrs))
        if identity_attr(self.path):  # what the file is, from its path
            self.file.attrs[IDENTITY_ATTR] = identity_attr(self.path)
        self.file.attrs[INPUTS_ATTR] = input_digests()

    def _write_rope(self, rope: RopeTable) -> None:
        """The RoPE table, each array under its name (the layout too: how each layer's stored, canonical dims map
        to the model's own; docs/data-model.md), each with its digest."""
        for name, (dims, values) in rope_variables(rope).items():
            dtype = ROPE_VARIABLES[name][1]
            var = self.file.create_variable(name, dims, h5py.string_dtype() if dtype == "str" else dtype, data=values)
            if dtype != "str":
                var.attrs[DIGEST_ATTR] = self.whole[name] = digest(np.asarray(values, dtype=dtype))

    def write_layer_errors(self, errors: np.ndarray) -> None:
        """The self-check's worst relative error of each layer (NaN: a layer the check did not reach)."""
        errors = np.asarray(errors, dtype=np.float64)
        var = self.file.create_variable("self_check_rel_error", ("layer",), "f8", data=errors)
        var.attrs[DIGEST_ATTR] = self.whole["self_check_rel_error"] = digest(errors)

    def write_heldout_coefficients(self, coefficients: np.ndarray, n_windows: int) -> None:
        """:data:`HELDOUT_COEF`, the coefficients of the mean key over ``n_windows`` held-out windows, (layer,
        kv_head, basis, dim)."""
        coefficients = np.asarray(coefficients, dtype=np.float64)
        self.file.dimensions["basis"] = coefficients.shape[2]
        dims = ("layer", "kv_head", "basis", "dim")
        var = self.file.create_variable(HELDOUT_COEF, dims, "f8", data=coefficients)
        var.attrs[DIGEST_ATTR] = self.whole[HELDOUT_COEF] = digest(coefficients)
        self.file.attrs["heldout_windows"] = int(n_windows)

    def holds(self, sample: int) -> bool:
        """Whether window ``sample`` (global index) is one this file keeps."""
        return bool((self.samples == sample).any())

    def write_sample(self, sample: int, q: np.ndarray, k: np.ndarray, token_id: np.ndarray, logits_ref=None):
        """Window ``sample`` (global index): q (layer, head, token, dim), k (layer, kv_head, token, dim);
        logits_ref (ref_layer, head, query, key) when it is a reference window."""
        position = int(np.flatnonzero(self.samples == sample)[0])
        self._write_blocks("q", position, self._stored(q, "q", sample))
        self._write_blocks("k", position, self._stored(k, "k", sample))
        self.token_id[position] = token_id
        if sample in self.ref_samples and self.ref_layers:  # ref_layers [] (long windows): no reference logits
            self._write_blocks("logits_ref", self.ref_samples.index(sample), logits_ref)
        self.written[position] = True

    def _write_blocks(self, name: str, position: int, x: np.ndarray) -> None:
        """``x`` (layer, ...) as ``name[position]``, with the digest of each layer's block as stored."""
        var = getattr(self, name)
        x = np.asarray(x, dtype=var.dtype)
        var[position] = x
        self.digests[name][position] = [digest(block) for block in x]

    def _stored(self, x: np.ndarray, name: str, sample: int) -> np.ndarray:
        """``x`` in the storage dtype; a value beyond its range fails (it would be stored as inf)."""
        if self.qk_dtype == np.float32:
            return x
        limit = float(np.finfo(self.qk_dtype).max)
        worst = float(np.abs(x).max())
        if worst > limit:
            raise OverflowError(
                f"extract.qk_dtype: {self.qk_dtype.name} overflows on {name} of window {sample} "
                f"(|{name}| reaches {worst:.3g} > {limit:.3g}); store float32"
            )
        return x.astype(self.qk_dtype)

    def close(self, ok: bool = True):
        # once only: a close that fails while publishing (refused after a SIGTERM, windows missing) is followed
        # by the caller's close(ok=False) on the way out, which must not touch the closed file (its error would
        # replace the first, and a terminated job would exit 1 instead of 128 + SIGTERM)
        if self.closed:
            return
        self.closed = True
        # token_id is written a row per window and is small: its digest from the file, once it is complete
        self.token_id.attrs[DIGEST_ATTR] = self.whole["token_id"] = digest(self.token_id[...])
        blocks = {name: var[...] for name, var in self.digests.items()}
        self.file.attrs[CONTENT_ATTR] = content_digest({**self.whole, **blocks})
        self.file.close()
        if ok and not self.written.all():
            missing = self.samples[~self.written].tolist()
            ok = False
            err = RuntimeError(f"{self.path}: samples {missing} were never written")
        else:
            err = None
        if ok:
            self._atomic.__exit__(None, None, None)
        else:
            self._atomic.__exit__(RuntimeError, RuntimeError("aborted"), None)
        if err:
            raise err

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(ok=exc_type is None)
        return False
