import numpy as np
import pytest
import xarray as xr

from posgen.integrity import StoreError
from posgen.rope_table import RopeTable
from posgen.store import QKLayout, QKWriter, atomic_path, open_dataset, write_netcdf


def _writer(path, rng, n_samples=2):
    rope = RopeTable(
        inv_freq=np.tile(10000.0 ** -(np.arange(4) / 4), (3, 1)),
        attention_scaling=np.ones(3),
        scaling=np.full(3, 8**-0.5),
        sliding_window=np.array([4, 0, 4]),
        kv_group=np.array([0, 0, 1, 1]),
    )
    layout = QKLayout(
        samples=range(n_samples),
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        n_tokens=10,
        head_dim=8,
        ref_samples=[0],
        ref_layers=[0, 2],
    )
    return QKWriter(path, layout, rope=rope, attrs={"model": "m", "seed": 3, "extra": {"a": 1}})


def test_qk_round_trip_through_xarray_with_named_dims(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "qk.h5"
    q = rng.standard_normal((2, 3, 4, 10, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, 2, 10, 8)).astype(np.float32)
    ref = rng.standard_normal((2, 4, 10, 10)).astype(np.float32)
    with _writer(path, rng) as w:
        for s in range(2):
            w.write_sample(s, q[s], k[s], np.arange(10) + s, ref if s == 0 else None)
    ds = open_dataset(path)
    assert not [d for d in ds.dims if str(d).startswith("phony")]
    assert ds["q"].dims == ("sample", "layer", "head", "token", "dim")
    assert ds["k"].dims == ("sample", "layer", "kv_head", "token", "dim")
    np.testing.assert_array_equal(ds["q"].values, q)
    np.testing.assert_array_equal(ds["k"].values, k)
    np.testing.assert_array_equal(ds["logits_ref"].sel(ref_sample=0).values, ref)
    assert ds["ref_layer"].values.tolist() == [0, 2]
    assert ds["sliding_window"].values.tolist() == [4, 0, 4]
    assert ds.attrs["model"] == "m" and ds.attrs["seed"] == 3 and ds.attrs["extra"] == '{"a": 1}'
    assert ds.attrs["torch_version"] and ds.attrs["transformers_version"]
    # one chunk per (sample, layer)
    assert ds["q"].encoding["chunksizes"] == (1, 1, 4, 10, 8)


def test_a_close_refused_while_publishing_is_not_followed_by_another_error(tmp_path, monkeypatch):
    """A job asked to stop (SIGTERM) whose SystemExit was lost runs on to its close; the publish refuses it, and
    the caller's close(ok=False) on the way out must leave that SystemExit alone (it once raised on the closed
    file, and the job exited 1)."""
    from posgen import termination

    rng = np.random.default_rng(0)
    path = tmp_path / "qk.h5"
    monkeypatch.setattr(termination, "RECEIVED", [15])
    w = _writer(path, rng, n_samples=1)
    w.write_sample(
        0,
        *(rng.standard_normal(s).astype(np.float32) for s in ((3, 4, 10, 8), (3, 2, 10, 8))),
        np.arange(10),
        rng.standard_normal((2, 4, 10, 10)).astype(np.float32),
    )
    with pytest.raises(SystemExit) as stopped:
        try:
            w.close(ok=True)
        except BaseException:
            w.close(ok=False)  # as extract does
            raise
    assert stopped.value.code == 128 + 15
    assert list(tmp_path.iterdir()) == []


def test_failed_or_incomplete_write_leaves_no_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "qk.h5"
    with pytest.raises(ZeroDivisionError):
        with _writer(path, rng) as w:
            1 / 0
    with pytest.raises(RuntimeError, match=r"samples \[1\] were never written"):
        with _writer(path, rng) as w:
            w.write_sample(0, np.zeros((3, 4, 10, 8)), np.zeros((3, 2, 10, 8)), np.arange(10), np.zeros((2, 4, 10, 10)))
    assert list(tmp_path.iterdir()) == []


def test_write_netcdf_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "x.nc"
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3.0))}), path)
    with pytest.raises(Exception):
        write_netcdf(xr.Dataset({"a": ("x", np.array([object()]))}), path)
    assert open_dataset(path, lazy=False)["a"].values.tolist() == [0.0, 1.0, 2.0]
    assert [p.name for p in tmp_path.iterdir()] == ["x.nc"]


def test_q_k_and_netcdf_variables_carry_checksums_and_stale_temporaries_are_swept(tmp_path):
    import os
    import subprocess
    import sys

    import h5py

    from posgen.store import sweep_stale_temporaries

    rng = np.random.default_rng(0)
    path = tmp_path / "qk.h5"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".qk.h5.{dead.stdout.strip()}.tmp"
    live = tmp_path / f".qk.h5.{os.getppid()}.tmp"  # another job still writing the same output
    stale.write_bytes(b"partial")
    live.write_bytes(b"partial")
    with _writer(path, rng, n_samples=1) as w:  # entering the atomic write sweeps first
        w.write_sample(0, np.ones((3, 4, 10, 8)), np.ones((3, 2, 10, 8)), np.arange(10), np.ones((2, 4, 10, 10)))
    assert not stale.exists() and live.exists()
    assert sweep_stale_temporaries(path) == []
    write_netcdf(xr.Dataset({"a": ("x", np.arange(3.0)), "n": ("x", np.arange(3))}), tmp_path / "x.nc")
    with h5py.File(path) as qk, h5py.File(tmp_path / "x.nc") as nc:
        assert qk["q"].fletcher32 and qk["k"].fletcher32 and qk["logits_ref"].fletcher32
        assert qk["q"].chunks == (1, 1, 4, 10, 8)  # the checksum keeps the per-(sample, layer) chunks
        assert nc["a"].fletcher32 and nc["n"].fletcher32


@pytest.mark.parametrize(
    "failure, words",
    [
        (OSError(28, "No space left on device"), "no space left on device"),
        # h5py's wording of a full disk carries the errno only in its text
        (
            OSError("Can't write data (file write failed: errno = 28, error message = 'No space left on device')"),
            "no space left on device",
        ),
        (
            RuntimeError(
                "[enforce fail at inline_container.cc:664] . unexpected pos 36928 vs 36816; No space left on device"
            ),
            "no space left on device",
        ),
        (PermissionError(13, "Permission denied"), "permission denied"),
        (OSError(30, "Read-only file system"), "read-only file system"),
    ],
)
def test_a_write_without_room_or_rights_is_one_line_and_leaves_no_temporary(tmp_path, monkeypatch, failure, words):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out" / "train.nc"
    target.parent.mkdir()
    target.write_text("the finished file")
    with pytest.raises(StoreError) as info:
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise failure
    assert str(info.value) == f"out/train.nc: cannot write ({words})"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert target.read_text() == "the finished file" and list(target.parent.iterdir()) == [target]


def test_other_errors_pass_through_the_writer(tmp_path):
    with pytest.raises(ValueError, match="a bug"):
        with atomic_path(tmp_path / "x.nc"):
            raise ValueError("a bug")
    with pytest.raises(OSError, match="Input/output error"):
        with atomic_path(tmp_path / "x.nc"):
            raise OSError(5, "Input/output error")


def test_a_large_write_without_room_is_refused_before_it_starts(tmp_path, monkeypatch):
    """qk.h5 and checkpoints know their size: a file system without room for it stops the job at the start, in
    one line naming the file, and leaves a finished file as it was."""
    import collections
    import shutil

    import torch

    from posgen.synthetic.train import save_checkpoint
    from posgen.testing.qk_store import write_qk_store

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 2, 10, 8)).astype(np.float32)  # (sample, layer, head, token, dim)
    k = rng.standard_normal((2, 1, 1, 10, 8)).astype(np.float32)  # (sample, layer, kv_head, token, dim)
    rope = RopeTable(
        inv_freq=10000.0 ** -(np.arange(4) / 4)[None],
        attention_scaling=np.ones(1),
        scaling=np.full(1, 8**-0.5),
        sliding_window=np.zeros(1, int),
        kv_group=np.array([0, 0]),
    )
    # q + k of 2 windows and the reference window's logits of layer 0: 2 * (2 + 1) * 10 * 8 * 4 + 2 * 10^2 * 4 bytes
    needed = 2 * 3 * 10 * 8 * 4 + 2 * 100 * 4
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9 - needed + 1, needed - 1))
    target = tmp_path / "out" / "qk.h5"
    target.parent.mkdir()
    target.write_text("the finished file")
    with pytest.raises(StoreError) as info:
        write_qk_store(target, q, k, rope)
    # the numbers as they are (issue 53: "needs 0.00 GB, 0.00 GB free"), in bytes where rounded ones look the same
    assert str(info.value) == "out/qk.h5: cannot write (needs 2,720 bytes, 2,719 bytes free on out)"
    assert target.read_text() == "the finished file" and list(target.parent.iterdir()) == [target]
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9 - needed, needed))
    write_qk_store(target, q, k, rope)  # exactly enough
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9 - 100, 100))
    with pytest.raises(StoreError, match=r"^out/model\.pt: cannot write \(needs 1\.\d\d kB, 100 bytes free on out\)$"):
        save_checkpoint(tmp_path / "out" / "model.pt", {"state_dict": {"w": torch.zeros(64)}})
    assert not (tmp_path / "out" / "model.pt").exists()
    # a disk full of small files: room in bytes, none for another file
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 0, 10**9))
    inodes = collections.namedtuple("statvfs", "f_files f_favail")
    monkeypatch.setattr("os.statvfs", lambda _: inodes(65536, 0))
    with pytest.raises(StoreError) as info:
        save_checkpoint(tmp_path / "out" / "model.pt", {"state_dict": {"w": torch.zeros(64)}})
    assert str(info.value) == "out/model.pt: cannot write (no file can be created: 0 of 65,536 inodes free on out)"
