"""Reads of posgen's HDF5 variables checked against the digests written with them (docs/data-model.md, "Checksums
and digests"): posgen.store wraps xarray's h5netcdf read with :func:`verified_read`, so every read of a posgen
.nc/.h5 file checks the data it reads."""

from __future__ import annotations

import itertools

import numpy as np

from posgen.integrity import BLOCK_DIGEST_ATTR, DIGEST_ATTR, EDITED, damaged, digest


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
