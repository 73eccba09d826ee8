"""The notebook API (posgen.api): README's "From Python" example, run as written on the embedded SmolLM2, gives
the workflow's numbers for the same window; the API's other entry points against their workflow jobs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from posgen import api
from posgen.config import schema_defaults
from posgen.corpus import write_windows
from posgen.decomposition import decompose_store
from posgen.decomposition.options import DecompositionOptions
from posgen.llm.extract import extract
from posgen.llm.fused import Analysis
from posgen.llm.options import ExtractOptions, HeadAblationOptions
from posgen.store import open_dataset
from posgen.testing.tiny import tiny_job

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The code block of README's "From Python" section."""
    section = README.read_text().split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def _assert_same(got, want, names, rtol=1e-6):
    for name in names:
        assert got[name].dims == want[name].dims, name
        np.testing.assert_allclose(got[name].values, want[name].values, rtol=rtol, atol=1e-7, err_msg=name)


def test_readme_example_gives_the_workflows_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the example writes resources/models/ and r_heatmap.png where it runs
    scope = {}
    exec(compile(readme_example(), "README.md", "exec"), scope)
    printed = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert (tmp_path / "r_heatmap.png").stat().st_size > 0

    # the workflow on the same window: rule windows, then extract on its default (fused) path, keeping the q/k,
    # then rule decompose's store path on that qk.h5, each with the schema's options
    windows = scope["windows"]
    write_windows(windows.copy(), tmp_path / "windows.h5")
    model_dir = tmp_path / "resources" / "models" / "smollm2-135m"
    decomposition = schema_defaults("decomposition")
    analysis = Analysis(
        DecompositionOptions(**decomposition),
        decomposition_path=tmp_path / "fused" / "decomposition.nc",
        bands_path=tmp_path / "fused" / "bands.nc",
    )
    job = tiny_job(model_dir, tmp_path / "windows.h5", tmp_path / "qk.h5", model="smollm2-135m")
    extract(job, ExtractOptions.defaults(), analysis=analysis)
    decompose_store(tmp_path / "qk.h5", tmp_path / "store.nc", DecompositionOptions(**decomposition), progress=False)

    qk, ours = scope["qk"], scope["decomposition"]
    stored = open_dataset(tmp_path / "qk.h5", lazy=False)
    for name in ("q", "k", "token_id", "inv_freq", "scaling", "attention_scaling", "sliding_window", "kv_group"):
        assert qk[name].dims == stored[name].dims, name
        np.testing.assert_array_equal(qk[name].values, stored[name].values, err_msg=name)
    assert qk.attrs["self_check_max_rel_error"] <= 1e-4 and qk.attrs["self_check_tokens"] == 128
    for path in (tmp_path / "fused" / "decomposition.nc", tmp_path / "store.nc"):
        workflow = open_dataset(path, lazy=False)
        assert set(ours.data_vars) == set(workflow.data_vars)
        _assert_same(ours, workflow, workflow.data_vars)
        for name in workflow.coords:
            np.testing.assert_array_equal(ours[name].values, workflow[name].values, err_msg=name)
        mean_r = float(workflow["r"].sel({"method": "A", "sink": "without"}).mean())
        assert printed == pytest.approx(mean_r, rel=1e-6, abs=1e-7)
    assert ours.attrs["analysis"] == "memory" and ours.attrs["variant"] == "trained"


def test_import_posgen_stays_light():
    """The Snakefile imports posgen's light modules while parsing: the API must not pull torch in with them."""
    code = (
        "import sys, posgen, posgen.paths, posgen.plan; "
        "import posgen.workflow.steps, posgen.workflow.figures, posgen.workflow.targets, posgen.workflow.job; "
        "heavy = [m for m in ('torch', 'transformers', 'xarray', 'h5py', 'matplotlib') if m in sys.modules]; "
        "assert not heavy, heavy; assert 'decompose' in dir(posgen)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_capture_takes_token_ids_text_and_a_load_model_triple(tiny_source, tmp_path):
    from posgen.models import acquire, load_model

    acquire(f"local:{tiny_source('llama')}", tmp_path / "model")
    loaded = load_model(tmp_path / "model")  # transformers' default attention: switched for the capture and back
    own = loaded[0].config._attn_implementation
    windows = api.windows(loaded, n_samples=2, seq_len=24)
    by_windows = api.capture_qk(loaded, windows)
    by_ids = api.capture_qk(loaded, windows["token_id"].values[1])
    assert loaded[0].config._attn_implementation == own
    assert by_windows.sizes["sample"] == 2 and by_ids["sample"].values.tolist() == [0]
    np.testing.assert_array_equal(by_ids["q"].values[0], by_windows["q"].values[1])
    text = api.capture_qk(tmp_path / "model", "The quick brown fox jumps over the lazy dog.", check=False)
    assert text.sizes["token"] == len(loaded[1]("The quick brown fox jumps over the lazy dog.").input_ids)
    with pytest.raises(ValueError, match="not \\(token,\\) or \\(sample, token\\)"):
        api.capture_qk(loaded, np.zeros((1, 2, 3), dtype=np.int64))


def test_ablate_heads_is_the_head_ablation_job_and_draws(tiny_source, tmp_path):
    from posgen.llm.head_ablation import head_ablation_job

    folder = api.model_folder(f"local:{tiny_source('llama')}", tmp_path / "models")
    assert api.model_folder(f"local:{tiny_source('llama')}", tmp_path / "models") == folder  # acquired once
    loaded = api.load(folder)
    windows = api.windows(loaded, n_samples=2, seq_len=16)
    decomposition = api.decompose(api.capture_qk(loaded, windows), device="cpu", dummy_distances=[0, 8])
    ours = api.ablate_heads(loaded, windows, decomposition=decomposition, probe_period=4)

    write_windows(windows.copy(), tmp_path / "windows.h5")
    decomposition.to_netcdf(tmp_path / "decomposition.nc", engine="h5netcdf")
    job = tiny_job(folder, tmp_path / "windows.h5", tmp_path / "head_ablation.nc")
    # every job option of the section (random_init chooses the workflow's variants, not a job's work)
    job_keys = set(schema_defaults("head_ablation")) - {"random_init"}
    options = {**schema_defaults("head_ablation", job_keys), "n_samples": 2, "seq_len": 16, "probe_period": 4}
    want = head_ablation_job(job, tmp_path / "decomposition.nc", HeadAblationOptions(**options))
    _assert_same(ours, want, want.data_vars)
    assert api.draw("head_ablation", ours).axes and api.draw("dummy_sweep", {"trained": decomposition}).axes
    with pytest.raises(KeyError, match="unknown"):
        api.draw("no_such_figure", decomposition)
