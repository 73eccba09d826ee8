"""Damaged inputs (issues 15 and 26): every damaged or edited input stops with one line naming the file and the
command that remakes it, and never turns into numbers; finished results elsewhere stay as they were.

Damaged inputs go through the library functions that read them; a few through the workflow, on a copy of the tiny
workflow's results, where the hinted command is run and must remake the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from posgen import paths
from posgen.corpus import CorpusError, cut_windows, load_text, read_windows, windows_job, write_windows
from posgen.models import CheckpointError, acquire, load_model
from posgen.store import StoreError, open_dataset, write_netcdf
from posgen.testing.runs import make_run

# ---------------------------------------------------------------------------------------------- damaged inputs


@pytest.fixture(scope="module")
def checkpoint(tiny_source, tmp_path_factory):
    """An acquired tiny checkpoint, its windows and a clean qk.h5 (read-only: tests damage copies)."""
    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.testing.tiny import tiny_job

    tmp = tmp_path_factory.mktemp("reliability")
    acquire(f"local:{tiny_source('llama')}", tmp / "model")
    _, tokenizer, _ = load_model(tmp / "model")
    write_windows(cut_windows(load_text("embedded"), tokenizer, 2, 24, 0), tmp / "windows.h5")
    extract(
        tiny_job(tmp / "model", tmp / "windows.h5", tmp / "qk.h5", model="tiny", variant="trained"),
        ExtractOptions.defaults(),
    )
    write_netcdf(open_dataset(tmp / "qk.h5", lazy=False)[["inv_freq", "scaling"]].load(), tmp / "decomposition.nc")
    return tmp


def _digest(folder: Path) -> dict:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


def _flip(path: Path, offset: int, n: int = 8) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        data = fh.read(n)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in data))


def _chunk_offset(path: Path, name: str, index: int = 0) -> int:
    with h5py.File(path) as f:
        assert f[name].fletcher32
        return f[name].id.get_chunk_info(index).byte_offset


def _copy(checkpoint: Path, tmp: Path, name: str) -> Path:
    target = tmp / "results" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if (checkpoint / name).is_dir():
        shutil.copytree(checkpoint / name, target)
    else:
        shutil.copy(checkpoint / name, target)
    return target


def _latin1_text(tmp):
    (tmp / "a.txt").write_bytes("caf\u00e9 cr\u00e8me\n".encode("latin-1"))
    return lambda: load_text(f"text:{tmp}/*.txt"), CorpusError, "a.txt line 1 is not UTF-8 text"


def _binary_text(tmp):
    (tmp / "blob.txt").write_bytes(bytes(range(256)))
    return lambda: load_text(f"text:{tmp}/blob.txt"), CorpusError, "blob.txt line 2 is not UTF-8 text (byte 0x80"


def _glob_hits_directory(tmp):
    (tmp / "texts").mkdir()
    return lambda: load_text(f"text:{tmp}/tex*"), CorpusError, "texts is a directory"


def _jsonl_directory(tmp):
    (tmp / "c.jsonl").mkdir()
    return lambda: load_text(f"jsonl:{tmp}/c.jsonl:text"), CorpusError, "c.jsonl is a directory"


def _jsonl_null(tmp):
    (tmp / "c.jsonl").write_text('{"text": "a"}\n{"text": null}\n')
    return lambda: load_text(f"jsonl:{tmp}/c.jsonl:text"), CorpusError, "c.jsonl line 2: field 'text' is null"


def _jsonl_number(tmp):
    (tmp / "c.jsonl").write_text('{"text": 3}\n')
    return lambda: load_text(f"jsonl:{tmp}/c.jsonl:text"), CorpusError, "c.jsonl line 1: field 'text' is int"


def _jsonl_latin1(tmp):
    (tmp / "c.jsonl").write_bytes('{"text": "a"}\n{"text": "caf\u00e9"}\n'.encode("latin-1"))
    return lambda: load_text(f"jsonl:{tmp}/c.jsonl:text"), CorpusError, "c.jsonl line 2 is not UTF-8 text"


def _jsonl_list_line(tmp):
    (tmp / "c.jsonl").write_text('["text"]\n')
    return lambda: load_text(f"jsonl:{tmp}/c.jsonl:text"), CorpusError, "c.jsonl line 1 has no field 'text'"


def _qk_truncated(tmp, checkpoint):
    path = _copy(checkpoint, tmp, "qk.h5")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return lambda: open_dataset(path), StoreError, "qk.h5: not a readable HDF5/netCDF file"


def _qk_empty(tmp, checkpoint):
    path = tmp / "results" / "qk.h5"
    path.parent.mkdir()
    path.write_bytes(b"")
    return lambda: open_dataset(path, lazy=False), StoreError, "delete it and run: snakemake --cores all"


def _qk_q_chunk_flipped(tmp, checkpoint):
    path = _copy(checkpoint, tmp, "qk.h5")
    _flip(path, _chunk_offset(path, "q", 1) + 100)
    return lambda: open_dataset(path, lazy=False)["q"].values, StoreError, "variable q: data fail their checksum"


def _qk_k_chunk_flipped_lazy(tmp, checkpoint):
    path = _copy(checkpoint, tmp, "qk.h5")
    _flip(path, _chunk_offset(path, "k", 0) + 40)
    return (
        lambda: open_dataset(path, lazy=True)["k"].sum().compute(),
        StoreError,
        "variable k: data fail their checksum",
    )


def _windows_truncated(tmp, checkpoint):
    path = _copy(checkpoint, tmp, "windows.h5")
    path.write_bytes(path.read_bytes()[:2000])
    return lambda: read_windows(path), StoreError, "windows.h5: not a readable HDF5/netCDF file"


def _windows_token_ids_flipped(tmp, checkpoint):
    path = _copy(checkpoint, tmp, "windows.h5")
    _flip(path, _chunk_offset(path, "token_id") + 16)
    return lambda: read_windows(path), StoreError, "variable token_id: data fail their checksum"


def _netcdf_overwritten(tmp, checkpoint):
    path = _copy(checkpoint, tmp, "decomposition.nc")
    path.write_bytes(b"\0" * path.stat().st_size)
    return lambda: open_dataset(path, lazy=False), StoreError, "decomposition.nc: not a readable HDF5/netCDF file"


def _weights_flipped(tmp, checkpoint):
    model = _copy(checkpoint, tmp, "model")
    _flip(model / "model.safetensors", 5000)
    return lambda: load_model(model), CheckpointError, "model.safetensors: sha256"


def _weights_truncated_with_matching_hash(tmp, checkpoint):
    """The manifest agrees with a truncated file (damaged before acquisition finished hashing): the safetensors
    reader's own error still names the file."""
    from posgen.models import sha256_file

    model = _copy(checkpoint, tmp, "model")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = sha256_file(weights)
    (model / "manifest.json").write_text(json.dumps(manifest))
    return lambda: load_model(model), CheckpointError, "model.safetensors: cannot be read"


def _config_json_missing(tmp, checkpoint):
    model = _copy(checkpoint, tmp, "model")
    (model / "config.json").unlink()
    return lambda: load_model(model, "random-seed0"), CheckpointError, "config.json: missing (listed in manifest.json)"


def _seq_len_beyond_context(tmp, checkpoint):
    model = _copy(checkpoint, tmp, "model")
    context = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    out = tmp / "results" / "windows.h5"
    return (
        lambda: windows_job(model, out, source="embedded", n_samples=1, seq_len=context + 1, seed=0, model_name="m"),
        CorpusError,
        f"config.seq_len: {context + 1} exceeds the model's context of {context} tokens",
    )


def _qk_q_block_reversed(tmp, checkpoint):
    """A plausible edit: one (sample, layer) block of q reversed along tokens, its Fletcher-32 checksum valid."""
    path = _copy(checkpoint, tmp, "qk.h5")
    with h5py.File(path, "r+") as f:
        f["q"][0, 1] = f["q"][0, 1][:, ::-1]
    read = lambda: open_dataset(path, lazy=True)["q"].isel(sample=0).mean().compute()  # noqa: E731
    return read, StoreError, "variable q (sample 0, layer 1): its data differ from what posgen wrote"


def _table_value_halved(tmp, checkpoint):
    """A plausible edit of a finished table: every value of one variable halved, its checksum valid."""
    path = _copy(checkpoint, tmp, "decomposition.nc")
    with h5py.File(path, "r+") as f:
        f["scaling"][...] = f["scaling"][...] / 2
    read = lambda: open_dataset(path, lazy=False)["scaling"].values  # noqa: E731
    return read, StoreError, "decomposition.nc: variable scaling: its data differ from what posgen wrote"


def _manifest_invalid_json(tmp, checkpoint):
    model = _copy(checkpoint, tmp, "model")
    (model / "manifest.json").write_text('{"files": ')
    return lambda: load_model(model), CheckpointError, "manifest.json: not valid JSON"


def _manifest_empty(tmp, checkpoint):
    model = _copy(checkpoint, tmp, "model")
    (model / "manifest.json").write_text("{}")
    return lambda: load_model(model), CheckpointError, "manifest.json: incomplete (lacks source, revision, files)"


def _tokenizer_truncated(tmp, checkpoint):
    model = _copy(checkpoint, tmp, "model")
    tokenizer = model / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:100])
    out = tmp / "results" / "windows.h5"
    return (
        lambda: windows_job(model, out, source="embedded", n_samples=1, seq_len=8, seed=0, model_name="m"),
        CheckpointError,
        "tokenizer.json: sha256",
    )


DAMAGED = [
    ("latin-1-text", _latin1_text),
    ("binary-text", _binary_text),
    ("glob-hits-directory", _glob_hits_directory),
    ("jsonl-directory", _jsonl_directory),
    ("jsonl-null-field", _jsonl_null),
    ("jsonl-number-field", _jsonl_number),
    ("jsonl-latin-1", _jsonl_latin1),
    ("jsonl-list-line", _jsonl_list_line),
    ("qk-truncated", _qk_truncated),
    ("qk-empty", _qk_empty),
    ("qk-q-chunk-flipped", _qk_q_chunk_flipped),
    ("qk-k-chunk-flipped-lazy", _qk_k_chunk_flipped_lazy),
    ("windows-truncated", _windows_truncated),
    ("windows-token-ids-flipped", _windows_token_ids_flipped),
    ("netcdf-overwritten", _netcdf_overwritten),
    ("weights-flipped", _weights_flipped),
    ("weights-truncated", _weights_truncated_with_matching_hash),
    ("config-json-missing", _config_json_missing),
    ("seq-len-beyond-context", _seq_len_beyond_context),
    ("qk-q-block-reversed", _qk_q_block_reversed),
    ("table-value-halved", _table_value_halved),
    ("manifest-invalid-json", _manifest_invalid_json),
    ("manifest-empty", _manifest_empty),
    ("tokenizer-truncated", _tokenizer_truncated),
]


@pytest.mark.parametrize("damage", [d[1] for d in DAMAGED], ids=[d[0] for d in DAMAGED])
def test_damaged_input_is_one_line_naming_the_file(damage, checkpoint, tmp_path):
    before = _digest(checkpoint)
    made = damage(tmp_path) if damage.__code__.co_argcount == 1 else damage(tmp_path, checkpoint)
    read, error, expected = made
    with pytest.raises(error) as info:
        read()
    message = str(info.value)
    assert "\n" not in message and expected in message, message
    assert str(tmp_path) in message or "config.seq_len" in message, message  # names the file
    if error is StoreError:
        assert "; delete it and run: snakemake --cores all " in message, message
    if error is CheckpointError:
        assert "; re-run get_model: delete " in message and "and run: snakemake --cores all " in message, message
    assert _digest(checkpoint) == before  # the finished results elsewhere are untouched
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_damaged_qk_never_turns_into_numbers(checkpoint, tmp_path):
    """A plausible edit (one q block reversed) keeps every value finite: only the checksum notices."""
    path = _copy(checkpoint, tmp_path, "qk.h5")
    offset = _chunk_offset(path, "q", 0)
    with h5py.File(path) as f:
        size = f["q"].id.get_chunk_info(0).size
    with open(path, "r+b") as fh:
        fh.seek(offset)
        block = np.frombuffer(fh.read(size), dtype=np.float32)
        fh.seek(offset)
        fh.write(block[::-1].tobytes())
    with pytest.raises(StoreError, match="variable q: data fail their checksum"):
        open_dataset(path, lazy=False)["q"].isel(sample=0, layer=0).values
    # other chunks (another layer) still read, and equal the clean file's
    clean = open_dataset(checkpoint / "qk.h5", lazy=False)["q"].isel(sample=0, layer=1).values
    np.testing.assert_array_equal(open_dataset(path, lazy=False)["q"].isel(sample=0, layer=1).values, clean)


# --------------------------------------------------------------------------------------------- through the workflow


@pytest.fixture
def damaged_workflow(tiny_workflow, tmp_path):
    """A copy of the tiny workflow's finished run (never the session's own: other tests read it)."""
    workdir = tmp_path / "run"
    shutil.copytree(tiny_workflow.workdir, workdir, symlinks=True)
    config = yaml.safe_load(tiny_workflow.configfile.read_text())
    return make_run(workdir, config)


def _outputs(workdir: Path) -> dict:
    return {p: p.read_bytes() for p in sorted((workdir / "results").rglob("*")) if p.is_file()}


def _forced_failure(run, target: Path, rule: str, log: str, removed=()) -> str:
    """``rule`` forced for ``target`` on the damaged run must fail: its log (``log``, under the run) without a
    traceback, every file under results/ as it was but the forced job's old outputs ``removed`` (Snakemake deletes
    them first), no temporary left. Returns the log's last line, the error."""
    before = _outputs(run.workdir)
    # the target between single-valued options: --configfile and --forcerun take every value that follows them
    proc = run.snakemake("--cores", "1", str(target.relative_to(run.workdir)), "--forcerun", rule, check=False)
    assert proc.returncode != 0
    lines = (run.workdir / log).read_text().strip().splitlines()
    assert not any(line.startswith("Traceback") for line in lines), proc.stderr[-3000:]
    for path in [target, *removed]:
        del before[path]
    assert _outputs(run.workdir) == before
    assert not list(run.workdir.rglob(".*.tmp"))
    return lines[-1]


def _hinted_command(line: str) -> list[str]:
    """The command an error line names (``...; delete it and run: snakemake ... (with the run's ...)``)."""
    command = line.split("and run: ", 1)[1].split(" (with the run's own --configfile", 1)[0]
    return command.split()[1:]  # the arguments after `snakemake`


# the hint of every damaged file of the tiny model's folder
MODEL_HINT = (
    "re-run get_model: delete resources/models/tiny-llama and run: snakemake --cores all "
    "resources/models/tiny-llama/manifest.json (with the run's own --configfile, if it had one)"
)


def _reverse_block(qk: Path) -> None:
    with h5py.File(qk, "r+") as f:  # Fletcher-32 stays valid: h5py writes the chunk anew
        f["q"][0, 0] = f["q"][0, 0][:, ::-1]


QK_DAMAGE = {  # how the block is damaged -> what the message says of it
    "bytes-flipped": (
        lambda qk: _flip(qk, _chunk_offset(qk, "q", 0) + 64),
        "variable q: data fail their checksum (Fletcher-32) or decompression, the file is corrupted",
    ),
    "block-reversed": (
        _reverse_block,
        "variable q (sample 0, layer 0): its data differ from what posgen wrote (edited or damaged after it was "
        "written)",
    ),
}


@pytest.mark.parametrize("damage", list(QK_DAMAGE))
def test_workflow_names_the_damaged_qk_and_its_hint_remakes_it(damage, damaged_workflow):
    run = damaged_workflow
    qk = run.workdir / "results/tiny-llama/trained/shards/0-2/qk.h5"  # the kept window the example heads read
    with open_dataset(qk, lazy=False) as opened:
        clean = opened["q"].values
    edit, said = QK_DAMAGE[damage]
    edit(qk)
    target = run.workdir / "results/tiny-llama/trained/examples.nc"
    last = _forced_failure(run, target, "examples", "logs/figures/tiny-llama/trained/examples.log")
    rel = qk.relative_to(run.workdir)
    assert last == (
        f"StoreError: {rel}: {said}; delete it and run: snakemake --cores all {rel} "
        "(with the run's own --configfile, if it had one)"
    )
    # the hinted command remakes the file (extraction on the same CPU: the same numbers)
    qk.unlink()
    run.snakemake(*_hinted_command(last))
    with open_dataset(qk, lazy=False) as opened:
        np.testing.assert_allclose(opened["q"].values, clean, rtol=0, atol=1e-6)


def test_workflow_refuses_changed_weights_before_extraction(damaged_workflow):
    run = damaged_workflow
    weights = run.workdir / "resources/models/tiny-llama/model.safetensors"
    clean = hashlib.sha256(weights.read_bytes()).hexdigest()
    _flip(weights, weights.stat().st_size // 2)
    shard = run.workdir / "results/tiny-llama/trained/shards/0-2"
    fused = [shard / "decomposition.nc", shard / "bands.nc"]  # the forced job's other outputs (fused path)
    last = _forced_failure(run, shard / "qk.h5", "extract", "logs/extract/tiny-llama/trained/0-2.log", fused)
    assert last.startswith("CheckpointError: resources/models/tiny-llama/model.safetensors: sha256 "), last
    assert last.endswith(MODEL_HINT), last
    # the hinted command: the folder deleted, get_model acquires it anew from its source
    shutil.rmtree(run.workdir / "resources/models/tiny-llama")
    run.snakemake(*_hinted_command(last))
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == clean


def test_edited_table_is_refused_and_the_hinted_command_remakes_it(damaged_workflow):
    """r halved in the gathered decomposition.nc (checksums valid): the summary job stops with one line, and the
    command it names remakes the file as it was; nothing else changes."""
    run = damaged_workflow
    table = run.workdir / "results/tiny-llama/trained/decomposition.nc"
    with open_dataset(table, lazy=False) as opened:
        clean = opened.load()
    with h5py.File(table, "r+") as f:
        f["r"][...] = f["r"][...] / 2
    summary = run.workdir / "results/tiny-llama"
    last = _forced_failure(
        run, summary / "summary.nc", "summarize", "logs/summarize/tiny-llama.log", [summary / "summary.csv"]
    )
    assert last.startswith(
        f"StoreError: {table.relative_to(run.workdir)}: variable r: its data differ from what "
        "posgen wrote (edited or damaged after it was written); delete it and run: "
    ), last
    # the hinted command, as the message says: the file deleted first, the run's configfile given
    table.unlink()
    run.snakemake(*_hinted_command(last))
    remade = open_dataset(table, lazy=False).load()
    for name, var in clean.data_vars.items():  # every number as before the edit
        np.testing.assert_array_equal(remade[name].values, var.values, err_msg=name)


def _manifest_not_json(model: Path) -> None:
    (model / "manifest.json").write_text('{"files": ')


def _tokenizer_cut(model: Path) -> None:
    (model / "tokenizer.json").write_bytes((model / "tokenizer.json").read_bytes()[:100])


MODEL_DAMAGE = {  # the damage -> the file the message names, and what it says
    "manifest-not-json": (_manifest_not_json, "manifest.json", "not valid JSON"),
    "tokenizer-truncated": (_tokenizer_cut, "tokenizer.json", "sha256"),
}


@pytest.mark.parametrize("damage", list(MODEL_DAMAGE))
def test_windows_job_refuses_a_damaged_model_folder_and_its_hint_restores_it(damage, damaged_workflow):
    run = damaged_workflow
    model = run.workdir / "resources/models/tiny-llama"
    clean = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    edit, name, said = MODEL_DAMAGE[damage]
    edit(model)
    target = run.workdir / "results/tiny-llama/windows.h5"
    last = _forced_failure(run, target, "windows", "logs/windows/tiny-llama.log")
    assert last.startswith(f"CheckpointError: resources/models/tiny-llama/{name}: {said}"), last
    assert last.endswith(MODEL_HINT), last
    shutil.rmtree(model)  # the hinted command
    run.snakemake(*_hinted_command(last))
    restored = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    assert restored[name] == clean[name] and restored.keys() == clean.keys()


def test_a_classifiers_curves_in_anothers_place_stop_the_gather_naming_them(damaged_workflow):
    """rope's train.nc in ALiBi's place (same experiment and task, its mtime kept, both files intact; issue 53): the
    forced gather stops with one line naming train.nc, and so does a forced analysis (not model.pt); every table
    stays as it was, and the hinted command remakes the file and, rerun, the same tables."""
    run = damaged_workflow
    folder = run.workdir / "results/synthetic/clean/distance"
    alibi = folder / "alibi/seed0/train.nc"
    stat = alibi.stat()
    shutil.copyfile(folder / "rope/seed0/train.nc", alibi)
    os.utime(alibi, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rel = alibi.relative_to(run.workdir)
    said = (
        f"StoreError: {rel}: another file in its place: it is the train.nc of experiment clean, task distance, "
        f"pe rope, seed 0 (its path: pe alibi); delete it and run: snakemake --cores all {rel} "
        "(with the run's own --configfile, if it had one)"
    )
    tables = {p: p.read_bytes() for p in (run.workdir / "results").rglob("*") if p.suffix in (".csv", ".md")}
    before = _outputs(run.workdir)
    proc = run.snakemake("--cores", "1", "--forcerun", "synthetic_gather", check=False)
    assert proc.returncode != 0
    lines = (run.workdir / "logs/synthetic/gather.log").read_text().strip().splitlines()
    assert lines[-1] == said and not any(line.startswith("Traceback") for line in lines), lines
    gathered = [run.workdir / paths.in_collection(t, "run") for t in paths.COLLECTION_PARTS.values()]
    assert _outputs(run.workdir) == {p: b for p, b in before.items() if p not in gathered}  # Snakemake removed those
    assert {p: p.read_bytes() for p in tables} == tables
    # the analysis of the task names train.nc too, not the checkpoint its digest no longer matches
    target = folder / "alibi/seed0/ablation.nc"
    analyses = [p for part in ("ablation", "toeplitz", "probe") for p in folder.glob(f"*/seed*/{part}.nc")]
    log = "logs/synthetic/analyse/clean/distance.log"  # clean: one analysis job per task, which Snakemake empties
    last = _forced_failure(run, target, "synthetic_analyse_task_clean", log, [p for p in analyses if p != target])
    assert last == said
    alibi.unlink()  # the hinted command, then the run: the same tables as before the swap
    run.snakemake(*_hinted_command(last))
    run.snakemake("--cores", "2")
    assert {p: p.read_bytes() for p in tables} == tables


def test_get_model_refuses_a_damaged_local_source_and_names_it(damaged_workflow, tiny_source, tmp_path):
    """A truncated model.safetensors in the models entry's `local:` folder (issue 53): get_model stops naming the
    source's file and saying to fix it there (acquiring it again would copy the same damage); once the source is
    fixed, the same command acquires it."""
    source = tmp_path / "source"
    shutil.copytree(tiny_source("llama"), source)
    weights = source / "model.safetensors"
    clean = weights.read_bytes()
    weights.write_bytes(clean[:5000])
    config = yaml.safe_load(damaged_workflow.configfile.read_text())
    config["models"][0]["source"] = f"local:{source}"
    run = make_run(damaged_workflow.workdir, config)
    model = run.workdir / "resources/models/tiny-llama"
    shutil.rmtree(model)  # what the hint of a damaged acquired copy says to do first
    manifest = str((model / "manifest.json").relative_to(run.workdir))
    proc = run.snakemake("--cores", "1", manifest, check=False)
    assert proc.returncode != 0 and not model.exists()
    last = (run.workdir / "logs/get_model/tiny-llama.log").read_text().strip().splitlines()[-1]
    assert last == (
        f"ModelSourceError: local:{source}: {weights} cannot be read (SafetensorError: Error while deserializing "
        "header: incomplete metadata, file not fully covered); fix or replace it in the source folder"
    )
    weights.write_bytes(clean)
    run.snakemake("--cores", "1", manifest)
    assert (model / "model.safetensors").read_bytes() == clean
