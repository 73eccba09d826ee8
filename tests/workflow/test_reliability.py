"""Reliability (issue 15): every bad config stops with one line naming the key or file, and killed jobs leave no
temporary behind once the next run has swept (damaged inputs: test_damaged_inputs.py).

Malformed configs go through posgen.config (fast); a handful through a real `snakemake -n`.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from posgen.config import ConfigError, configfiles_in_argv, load, validate
from posgen.corpus import cut_windows, load_text, write_windows
from posgen.models import acquire, load_model
from posgen.testing.runs import ROOT, SNAKEMAKE, make_run, tiny_config

BASE = yaml.safe_load((ROOT / "config.yaml").read_text())


# ------------------------------------------------------------------------------------------ malformed configs


def _set(path, value):
    """An edit of the default config: the key at ``path`` (list of keys/indices) becomes ``value``."""

    def edit(config, tmp):
        node = config
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value(tmp) if callable(value) else value

    return edit


def _local_folder(*files):
    """A ``local:`` source folder holding ``files`` (empty files), for the model-path checks."""

    def make(tmp):
        folder = tmp / "ckpt"
        folder.mkdir()
        for name in files:
            (folder / name).write_text("{}")
        return f"local:{folder}"

    return make


def _corpus_dir(tmp):
    (tmp / "corpus.jsonl").mkdir()
    return f"jsonl:{tmp}/corpus.jsonl:text"


# (id, edit of the default config, the message starts with)
MALFORMED = [
    (
        "dup-dummy-distances",
        _set(["decomposition", "dummy_distances"], [0, 100, 100]),
        "config.decomposition.dummy_distances:",
    ),
    ("dup-ref-samples", _set(["extract", "ref_samples"], [0, 0]), "config.extract.ref_samples:"),
    ("dup-ref-layers", _set(["extract", "ref_layers"], [-1, -1]), "config.extract.ref_layers:"),
    ("dup-rates", _set(["perturb", "rates"], [0, 0.1, 0.1]), "config.perturb.rates:"),
    ("dup-caps", _set(["perturb", "caps"], [8, 8]), "config.perturb.caps:"),
    ("dup-seeds", _set(["random_init_seeds"], [0, 0]), "config.random_init_seeds:"),
    ("dup-synthetic-seeds", _set(["synthetic", "seeds"], [1, 1]), "config.synthetic.seeds:"),
    ("dup-pes", _set(["synthetic", "pes"], ["rope", "rope"]), "config.synthetic.pes:"),
    ("cap-never-applies", _set(["perturb", "caps"], [8, 255]), "config.perturb.caps: cap 255 never applies"),
    ("cap-beyond-window", _set(["perturb", "caps"], [1000]), "config.perturb.caps: cap 1000 never applies"),
    ("map-tokens-beyond-seq-len", _set(["figures", "map_tokens"], 2000), "config.figures.map_tokens: 2000 exceeds"),
    ("figure-sample-beyond-n", _set(["figures", "sample"], 8), "config.figures.sample: sample 8 does not exist"),
    ("bound-samples-beyond-n", _set(["decomposition", "bound_samples"], 9), "config.decomposition.bound_samples:"),
    ("perturb-seq-len-beyond", _set(["perturb", "seq_len"], 5000), "config.perturb.seq_len: 5000 exceeds"),
    ("head-ablation-n-beyond", _set(["head_ablation", "n_samples"], 9), "config.head_ablation.n_samples: 9 exceeds"),
    ("ref-sample-missing", _set(["extract", "ref_samples"], [8]), "config.extract.ref_samples: sample 8"),
    ("local-missing", _set(["models", 0, "source"], lambda t: f"local:{t}/nowhere"), "config.models[0].source:"),
    ("local-is-file", _set(["models", 0, "source"], lambda t: f"local:{ROOT / 'config.yaml'}"), "config.models[0]"),
    ("local-no-config", _set(["models", 0, "source"], _local_folder("model.safetensors")), "config.models[0].source:"),
    ("local-no-weights", _set(["models", 0, "source"], _local_folder("config.json")), "config.models[0].source:"),
    (
        "local-pickle-only",
        _set(["models", 0, "source"], _local_folder("config.json", "pytorch_model.bin")),
        "config.models[0].source:",
    ),
    ("jsonl-missing", _set(["corpus", "source"], lambda t: f"jsonl:{t}/none.jsonl:text"), "config.corpus.source:"),
    ("jsonl-directory", _set(["corpus", "source"], _corpus_dir), "config.corpus.source:"),
    ("text-no-match", _set(["corpus", "source"], lambda t: f"text:{t}/*.txt"), "config.corpus.source: no file"),
    ("seq-len-huge", _set(["seq_len"], 2_000_000), "config.seq_len:"),
    ("n-samples-huge", _set(["n_samples"], 10**6), "config.n_samples:"),
    ("seed-too-large", _set(["random_init_seeds"], [2**32]), "config.random_init_seeds[0]:"),
    ("window-seed-negative", _set(["window_seed"], -1), "config.window_seed:"),
    ("check-rtol-above-1", _set(["extract", "check_rtol"], 2.0), "config.extract.check_rtol:"),
    ("lstsq-tol-zero", _set(["decomposition", "lstsq_tol"], 0), "config.decomposition.lstsq_tol:"),
    ("bootstrap-huge", _set(["intervals", "bootstrap"], 10**7), "config.intervals.bootstrap:"),
    ("compression-10", _set(["extract", "compression"], 10), "config.extract.compression:"),
    ("rate-above-1", _set(["perturb", "rates"], [1.5]), "config.perturb.rates[0]:"),
    (
        "trust-remote-code-string",
        _set(["models", 0, "trust_remote_code"], "yes"),
        "config.models[0].trust_remote_code:",
    ),
    (
        "max-count-beyond",
        _set(["synthetic", "count"], {"seq_len": 8, "max_count": 9}),
        "config.synthetic.count.max_count:",
    ),
    (
        "width-not-multiple",
        _set(["synthetic", "model"], {"d_model": 30, "n_heads": 4}),
        "config.synthetic.model.d_model:",
    ),
    ("figures-seed-negative", _set(["figures", "seed"], -2), "config.figures.seed:"),
]


@pytest.mark.parametrize("edit, expected", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_config_is_refused_with_one_line_naming_the_key(edit, expected, tmp_path):
    config = copy.deepcopy(BASE)
    edit(config, tmp_path)
    with pytest.raises(ConfigError) as info:
        validate(config)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(expected), message


def test_cross_key_messages_name_value_and_limit(tmp_path):
    config = copy.deepcopy(BASE)
    config["figures"] = {"map_tokens": 2000}
    with pytest.raises(ConfigError, match=r"^config\.figures\.map_tokens: 2000 exceeds seq_len 1200$"):
        validate(config)
    config = copy.deepcopy(BASE)
    config["perturb"] = {"seq_len": 64, "caps": [8, 63]}
    with pytest.raises(ConfigError, match=r"cap 63 never applies .*perturb\.seq_len 64 .* is 63; use caps below 63"):
        validate(config)
    config["perturb"]["caps"] = [8, 62]  # distance 63 exists in a 64-token window: the cap applies
    validate(config)


# (id, file content as bytes, the message contains)
BAD_FILES = [
    ("unclosed-bracket", b"models: [\n", "line 2 column 1: not valid YAML"),
    ("tab-indent", b"corpus:\n\tsource: embedded\n", "line 2 column 1: not valid YAML (found character '\\t'"),
    ("empty", b"", "config file is empty"),
    ("comments-only", b"# nothing here\n", "config file is empty"),
    ("top-level-list", b"- models\n- corpus\n", "line 1: expected a mapping of keys at the top level, found a list"),
    ("top-level-scalar", b"hello\n", "found a str"),
    ("duplicate-key", b"n_samples: 8\nseq_len: 64\nn_samples: 4\n", "line 3 column 1: not valid YAML (duplicate key"),
    ("duplicate-nested-key", b"corpus:\n  source: embedded\n  source: x\n", "line 3 column 3: not valid YAML (dup"),
    ("duplicate-json-key", b'{"n_samples": 8, "n_samples": 4}', "duplicate key 'n_samples'"),
    ("unclosed-quote", b"corpus: {source: 'embedded}\n", "not valid YAML"),
    ("mapping-in-scalar", b"n_samples: 8: 4\n", "line 1 column 13: not valid YAML (mapping values"),
    ("latin-1", "corpus:\n  source: caf\u00e9\n".encode("latin-1"), "line 2: not UTF-8 text"),
]


@pytest.mark.parametrize("content, expected", [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_config_file_errors_name_the_file_and_line(content, expected, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    assert expected in message, message


def test_missing_or_directory_config_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/none\.yaml: config file not found$"):
        load(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: is a directory, not a config file$"):
        load(tmp_path)


def test_configfiles_are_found_in_any_command_line_form():
    argv = ["-n", "--configfile", "a.yaml", "b.yaml", "--cores", "1", "--configfiles=c.yaml", "--", "x.yaml"]
    assert configfiles_in_argv(argv) == ["a.yaml", "b.yaml", "c.yaml"]


# ------------------------------------------------------------------------------------- through snakemake -n


def _dry_run(workdir: Path, configfile: str) -> subprocess.CompletedProcess:
    cmd = [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--configfile", configfile, "-n"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=120)


SNAKEMAKE_CASES = [
    ("unclosed-bracket", "models: [\n", r"bad\.yaml, line 2 column 1: not valid YAML"),
    ("tab-indent", "corpus:\n\tsource: embedded\n", r"bad\.yaml, line 2 column 1: not valid YAML .*tabs"),
    ("empty", "", r"bad\.yaml: config file is empty"),
    ("top-level-list", "- a\n- b\n", r"bad\.yaml, line 1: expected a mapping"),
    ("duplicate-key", "n_samples: 8\nn_samples: 4\n", r"bad\.yaml, line 2 column 1: .*duplicate key 'n_samples'"),
    ("missing-file", None, r"/nonexistent/posgen\.yaml: config file not found"),
    ("cross-key", {"figures": {"map_tokens": 4000}}, r"config\.figures\.map_tokens: 4000 exceeds seq_len 48"),
]


@pytest.mark.parametrize("content, expected", [c[1:] for c in SNAKEMAKE_CASES], ids=[c[0] for c in SNAKEMAKE_CASES])
def test_snakemake_stops_with_one_line_and_touches_no_result(content, expected, tmp_path, tiny_source):
    config = tiny_config(tiny_source("llama"))
    finished = tmp_path / "results" / "tiny-llama" / "summary.csv"
    finished.parent.mkdir(parents=True)
    finished.write_text("finished\n")
    before = finished.stat().st_mtime_ns
    if isinstance(content, dict):
        configfile = make_run(tmp_path, {**config, **content}).configfile
    elif content is None:
        configfile = Path("/nonexistent/posgen.yaml")
    else:
        configfile = tmp_path / "bad.yaml"
        configfile.write_text(content)
    proc = _dry_run(tmp_path, str(configfile))
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Using ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("ConfigError: ") and re.search(expected, lines[0]), lines[0]
    assert finished.read_text() == "finished\n" and finished.stat().st_mtime_ns == before
    assert not (tmp_path / ".snakemake" / "locks").exists() or not any((tmp_path / ".snakemake" / "locks").iterdir())


# -------------------------------------------------------------------------------------------------- faults

FAULT_SCRIPT = """
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, {scripts!r})
from _common import setup

out = Path({out!r})
setup(SimpleNamespace(scriptdir={scripts!r}, log=[str(out.with_suffix(".log"))], input=[], output=[str(out)], threads=1,
                      rule="extract"), uses_torch=True)
import posgen.llm.extract
from posgen.llm.extract import extract
from posgen.llm.options import ExtractOptions
from posgen.testing.tiny import tiny_job

# pace the windows (0.05 s each) so the kill lands mid-file on a machine of any speed
_tqdm = posgen.llm.extract.tqdm
posgen.llm.extract.tqdm = lambda items, **kw: (time.sleep(0.05) or item for item in _tqdm(items, **kw))
extract(tiny_job({model!r}, {windows!r}, out), ExtractOptions.defaults())
"""


def _extract_in_process(tmp: Path, out: Path) -> None:
    """The same extraction in this process, on one thread like the subprocess (bit-identical results)."""
    import torch

    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.testing.tiny import tiny_job

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        extract(
            tiny_job(tmp / "model", tmp / "windows.h5", out, model="tiny", variant="trained"),
            ExtractOptions.defaults(),
        )
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def long_extraction(tiny_source, tmp_path_factory):
    """A tiny model with enough windows that its extraction runs a few seconds, and a clean run's qk.h5."""
    tmp = tmp_path_factory.mktemp("fault")
    acquire(f"local:{tiny_source('llama')}", tmp / "model")
    _, tokenizer, _ = load_model(tmp / "model")
    write_windows(cut_windows(load_text("embedded"), tokenizer, 150, 128, 0), tmp / "windows.h5")
    _extract_in_process(tmp, tmp / "clean" / "qk.h5")
    return tmp


def _run_extraction(tmp: Path, out: Path, stderr) -> subprocess.Popen:
    """The extraction as a workflow job runs it: through workflow_scripts/_common.setup, in a subprocess."""
    out.parent.mkdir(parents=True, exist_ok=True)
    script = FAULT_SCRIPT.format(
        scripts=str(ROOT / "workflow_scripts"), out=str(out), model=str(tmp / "model"), windows=str(tmp / "windows.h5")
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-c", script], env=env, stderr=stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_extraction_leaves_no_temporary_after_the_rerun(signum, long_extraction, tmp_path, tmp_path_factory):
    out = tmp_path / "qk.h5"
    stderr = tmp_path_factory.mktemp("killed") / "stderr.txt"  # beside, not in, the job's folder
    with stderr.open("w") as err:
        proc = _run_extraction(long_extraction, out, err)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".qk.h5.*.tmp")):
        assert proc.poll() is None and time.monotonic() < deadline, "extraction ended before it could be killed"
        time.sleep(0.05)
    time.sleep(0.3)  # a few windows into the file; the paced run takes 7.5 s
    assert proc.poll() is None, "extraction finished before the kill"
    proc.send_signal(signum)
    proc.wait(timeout=60)
    assert not out.exists()
    left = list(tmp_path.glob(".qk.h5.*.tmp"))
    if signum == signal.SIGTERM:  # cleaned up on the way out, and the job says why it stopped
        assert proc.returncode == 128 + signal.SIGTERM and left == [], stderr.read_text()[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL and len(left) == 1  # nothing runs on SIGKILL
    # the rerun (another pid) sweeps the dead job's temporary before writing its own
    _extract_in_process(long_extraction, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qk.h5", "qk.log"]
    with h5py.File(out) as got, h5py.File(long_extraction / "clean" / "qk.h5") as want:
        for name in ("q", "k", "logits_ref", "token_id"):
            np.testing.assert_array_equal(got[name][()], want[name][()])


def test_job_setup_sweeps_a_dead_jobs_temporary(tmp_path):
    """workflow_scripts/_common.setup sweeps at job start; a live process's temporary is kept."""
    sys.path.insert(0, str(ROOT / "workflow_scripts"))
    from _common import setup

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".qk.h5.{dead.stdout.strip()}.tmp"
    live = tmp_path / f".qk.h5.{os.getppid()}.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    job = type(
        "Job",
        (),
        {
            "scriptdir": str(ROOT / "workflow_scripts"),
            "log": [str(tmp_path / "job.log")],
            "input": [],
            "output": [str(tmp_path / "qk.h5")],
            "threads": 1,
            "rule": "extract",
        },
    )
    saved = sys.stdout, sys.stderr, sys.excepthook, signal.getsignal(signal.SIGTERM)
    try:
        setup(job)
    finally:
        sys.stdout.close()
        sys.stdout, sys.stderr, sys.excepthook = saved[:3]
        signal.signal(signal.SIGTERM, saved[3])
    assert not stale.exists() and live.exists()
    assert f"removed {stale}, a temporary left by a killed job" in (tmp_path / "job.log").read_text()
