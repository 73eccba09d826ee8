"""posgen.plan: shapes, the bytes of the cost model against a real extraction, resources that follow the model."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from posgen import plan, plan_model
from posgen.config import load
from posgen.shapes import SHAPES, parameter_count, shape_config
from posgen.testing.runs import ROOT
from posgen.workflow import sharding, steps

SMOLLM2 = plan_model.Shape.from_dict(SHAPES["smollm2-135m"])
LLAMA8B = plan_model.Shape.from_dict(SHAPES["llama-3.1-8b"])


def small_config(**extract) -> dict:
    return {
        "models": [{"name": "smollm2-135m", "source": "embedded:smollm2-135m"}],
        "n_samples": 8,
        "seq_len": 1200,
        "random_init_seeds": [0],
        "dtype": "float32",
        "device": "auto",
        "extract": {"ref_samples": [0], "ref_layers": [0, -1], **extract},
        "decomposition": {"dummy_distances": [0, 250, 500, 1000, 2000], "dummy_distance": 1000, "bound_samples": 2},
        "perturb": {"n_samples": 4, "seq_len": 256, "rates": [0, 0.01, 0.1], "caps": [8, 32], "random_init": True},
        "head_ablation": {
            "n_samples": 2,
            "seq_len": 32,
            "probe_samples": 2,
            "probe_period": 16,
            "seed": 0,
            "probes": ["windows", "repeat"],
            "random_init": True,
        },
        "band_interventions": {"n_samples": 2, "seq_len": 64, "shares": [0.25], "ablate": False, "random_init": True},
    }


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_analytic_parameter_count_matches_the_built_model(name):
    # the plan counts parameters from config.json alone (no transformers in the Snakefile's resource callables)
    exact = parameter_count(shape_config(name))
    assert plan_model.Shape.from_dict(SHAPES[name]).n_params == pytest.approx(exact, rel=1e-3)


def test_shape_reads_sliding_layers():
    gemma2 = plan_model.Shape.from_dict(SHAPES["gemma-2-9b"])
    assert (gemma2.n_sliding, gemma2.sliding_window, gemma2.softcap) == (21, 4096, True)
    assert gemma2.windows(4096) == [0]  # a 4096 window covers a 4096-token sequence: one mask
    assert gemma2.windows(8192) == [0, 4096]
    assert plan_model.Shape.from_dict(SHAPES["qwen2.5-7b"]).n_sliding == 0
    gemma3 = plan_model.Shape.from_dict(SHAPES["gemma3-270m"])
    assert gemma3.windows(1200) == [0, 512] and gemma3.n_sliding == 15  # 5 local : 1 global, transformers' default


def test_shape_reads_the_widest_head_of_a_model_whose_head_size_varies_by_layer():
    """Gemma 4: sliding layers' heads are 256 wide, full layers' 512 (qk.h5 stores every layer at the widest)."""
    import transformers

    config = transformers.Gemma4TextConfig(num_hidden_layers=6, vocab_size=1000).to_dict()
    assert config["head_dim"] == 256
    assert plan_model.Shape.from_dict(config).head_dim == 512
    assert plan_model.Shape.from_dict({**config, "per_layer_config": {}, "global_head_dim": None}).head_dim == 256


def test_forward_flops_of_llama_8b():
    # 2 P_body T: P_body is the 8.03B parameters less the two 128256 x 4096 embedding matrices and the final norm
    body = 8_030_261_248 - 2 * 128256 * 4096 - 4096
    assert LLAMA8B.n_body == pytest.approx(body, rel=1e-4)
    T = 4096
    expected = 2 * body * T + 2 * 32 * 32 * 128 * T * T
    assert plan_model.forward_flops(LLAMA8B, T) == pytest.approx(expected, rel=1e-4)


def test_job_resources_are_sane_and_monotone(tiny_source):
    cfg = small_config()
    tiny = plan_model.Shape.from_dict(json.loads((tiny_source("llama") / "config.json").read_text()))
    for rule in steps.MODEL_JOB_RULES:
        for device in ("cpu", "gpu"):
            small = plan.job_resources(rule, tiny, cfg, 4, 1, device)
            big = plan.job_resources(rule, SMOLLM2, cfg, 4, 1, device)
            assert set(small) == {"mem_mb", "runtime", "gpu_mem_mb", "disk_mb"}
            assert all(isinstance(v, int) and v >= 0 for v in small.values()), (rule, small)
            assert big["mem_mb"] >= small["mem_mb"] and big["runtime"] >= small["runtime"], (rule, device)
            retry = plan.job_resources(rule, SMOLLM2, cfg, 4, 2, device)
            assert retry["mem_mb"] > big["mem_mb"] and retry["runtime"] > big["runtime"], (rule, device)
            assert plan.job_resources(rule, SMOLLM2, cfg, 4, 3, device)["mem_mb"] > retry["mem_mb"]
    # an 8B model in bfloat16 on the GPU: its 16 GB of weights and more, and a bigger shard runs longer
    paper = {**small_config(), "dtype": "bfloat16", "seq_len": 4096, "n_samples": 32}
    one = plan.job_resources("extract", LLAMA8B, paper, 1, 1, "gpu")
    four = plan.job_resources("extract", LLAMA8B, paper, 4, 1, "gpu")
    assert 16_000 < one["gpu_mem_mb"] < 80_000, one
    assert four["gpu_mem_mb"] == one["gpu_mem_mb"]  # one window at a time
    for rule in steps.MODEL_JOB_RULES:  # the estimate; the runtime ask has a 10-minute floor
        for device in ("cpu", "gpu"):
            four = plan.job_cost(rule, LLAMA8B, paper, (0, 4), device).seconds
            assert four > plan.job_cost(rule, LLAMA8B, paper, (0, 1), device).seconds, (rule, device)
    shard = plan.job_resources("extract", LLAMA8B, paper, 4, 1, "cpu")
    assert shard["runtime"] > plan.job_resources("extract", LLAMA8B, paper, 1, 1, "cpu")["runtime"]
    # on the CPU nothing goes to a GPU
    assert plan.job_resources("extract", LLAMA8B, paper, 1, 1, "cpu")["gpu_mem_mb"] == 0


def test_disk_follows_keep_qk_dtype_and_mode():
    T = 1200
    qk32 = SMOLLM2.qk_bytes(T)
    refs = 2 * SMOLLM2.logits_bytes(T)
    store = plan.job_cost("extract", SMOLLM2, small_config(analysis="store"), (0, 8), "gpu")
    assert store.disk_gb * 1e9 == pytest.approx(8 * qk32 + refs)
    assert store.refs_gb * 1e9 == pytest.approx(refs)
    # the fused path keeps one window in float16 and checks the reference logits in memory
    fused = plan.job_cost("extract", SMOLLM2, small_config(keep_qk=1, qk_dtype="float16"), (0, 8), "gpu")
    assert fused.refs_gb == 0
    results = fused.disk_gb * 1e9 - qk32 / 2
    assert 0 < results < 0.1 * qk32  # the NetCDFs of 8 windows are small next to one window's q/k
    # a shard past the kept windows writes only its NetCDFs, and no reference logits
    later = plan.job_cost("extract", SMOLLM2, small_config(keep_qk=1), (4, 8), "gpu")
    assert later.disk_gb * 1e9 == pytest.approx(results / 2)
    with pytest.raises(ValueError, match="extract.analysis"):
        plan.config_options(small_config(analysis="later"))


def test_disk_model_matches_a_real_extraction(tmp_path, tiny_source):
    """The bytes the plan predicts for a store-mode extraction are the bytes qk.h5 takes (within 5 %)."""
    import xarray as xr

    from posgen.corpus import write_windows
    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.models import acquire
    from posgen.testing.tiny import tiny_job

    model_dir = tmp_path / "model"
    acquire(f"local:{tiny_source('llama')}", model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    n, T = 3, 256
    ids = np.random.default_rng(0).integers(0, config["vocab_size"], size=(n, T))
    windows = tmp_path / "windows.h5"
    coords = {"sample": np.arange(n), "token": np.arange(T)}
    write_windows(xr.Dataset({"token_id": (("sample", "token"), ids)}, coords=coords), windows)
    out = tmp_path / "qk.h5"
    job = tiny_job(
        model_dir,
        windows,
        out,
        model="tiny",
        variant="trained",
    )
    extract(job, ExtractOptions.defaults(transparency_tokens=16, check_tokens=16))
    cfg = {**small_config(analysis="store"), "n_samples": n, "seq_len": T}
    cost = plan.job_cost("extract", plan_model.Shape.from_dict(config), cfg, (0, n), "cpu")
    assert out.stat().st_size == pytest.approx(cost.disk_gb * 1e9, rel=0.05)


def test_rule_resources_read_the_acquired_config(tmp_path):
    cfg = small_config()
    entry = {"name": "mine", "source": "hf:someone/unknown-model", "gpus": 2}
    model_dir = tmp_path / "resources" / "models" / "mine"
    model_dir.mkdir(parents=True)
    # not acquired yet, not a recorded shape: the stand-in asks until Snakemake evaluates again
    assert plan.rule_resources("extract", model_dir, entry, "trained", "0-4", cfg)["mem_mb"] == 64000
    (model_dir / "config.json").write_text(json.dumps(SHAPES["smollm2-135m"]))
    got = plan.rule_resources("extract", model_dir, entry, "trained", "0-4", cfg)
    assert got == {**plan.job_resources("extract", SMOLLM2, cfg, 4, 1, "gpu"), "gpu": 2}
    assert set(got) == set(plan.resource_names("extract"))
    # perturb and cap shard their own windows; the whole rule without a shard wildcard
    assert plan.rule_resources("perturb", model_dir, entry, "trained", None, cfg) == {
        **plan.job_resources("perturb", SMOLLM2, cfg, 4, 1, "gpu"),
        "gpu": 2,
    }
    # head_ablation: one job over its own head_ablation.n_samples windows, on the model's GPUs
    assert plan.rule_resources("head_ablation", model_dir, entry, "trained", None, cfg) == {
        **plan.job_resources("head_ablation", SMOLLM2, cfg, 2, 1, "gpu"),
        "gpu": 2,
    }
    assert sharding.rule_shards("head_ablation", {**cfg, "shards": 2}) == [(0, 2)]
    # band_interventions too: one job over its own band_interventions.n_samples windows, on the model's GPUs
    assert plan.rule_resources("band_interventions", model_dir, entry, "trained", None, cfg) == {
        **plan.job_resources("band_interventions", SMOLLM2, cfg, 2, 1, "gpu"),
        "gpu": 2,
    }
    assert sharding.rule_shards("band_interventions", {**cfg, "shards": 2}) == [(0, 2)]
    assert sharding.rule_shards("perturb", {**cfg, "shards": 2}) == [(0, 2), (2, 4)]
    # bands never asks for a GPU; a config on the CPU gets CPU figures (and still the GPU ask of the profile)
    assert "gpu" not in plan.rule_resources("bands", model_dir, entry, "trained", "0-4", cfg)
    assert "gpu" not in plan.resource_names("bands")
    on_cpu = plan.rule_resources("extract", model_dir, entry, "trained", "0-4", {**cfg, "device": "cpu"})
    assert on_cpu == {**plan.job_resources("extract", SMOLLM2, cfg, 4, 1, "cpu"), "gpu": 2}
    # a recorded shape by hub id, before acquisition
    hub = {"name": "l8", "source": "hf:meta-llama/Llama-3.1-8B@d04e592bb4f6aa9cfee91e2e20afa771667e1d4b"}
    assert plan_model.model_shape_at(tmp_path / "resources" / "models" / "l8", hub) == LLAMA8B


def _band_cost(shape, device, n=2, **section):
    cfg = small_config()
    cfg["band_interventions"] = {**cfg["band_interventions"], "n_samples": n, **section}
    return plan.job_cost("band_interventions", shape, cfg, (0, n), device)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("shape", [SMOLLM2, LLAMA8B], ids=["smollm2", "llama8b"])
def test_band_interventions_cost_grows_with_the_settings_and_the_window(shape, device):
    """A band_interventions job (one per model variant) runs every setting on every window: its time is a fixed
    start (start-up, weights, the capturing pass) plus windows x settings x one pass's work; its memory holds two
    sets of every layer's float32 attention probabilities, 2 L H T^2 4 bytes, besides terms linear in T."""
    from posgen.llm.band_settings import grid

    shares = [0.25, 0.5]
    plain, full = {"shares": shares, "ablate": False}, {"shares": shares, "ablate": True}
    S_plain, S_full = len(grid(shares, False)), len(grid(shares, True))
    assert (S_plain, S_full) == (5, 9)
    # seconds = fixed + n S p: the pass's p from twice the windows, the fixed start from it
    two, four = (_band_cost(shape, device, n, seq_len=256, **plain).seconds for n in (2, 4))
    p = (four - two) / (2 * S_plain)
    fixed = two - 2 * S_plain * p
    with_ablation = _band_cost(shape, device, 2, seq_len=256, **full).seconds
    assert with_ablation == pytest.approx(fixed + 2 * S_full * p)
    assert 0 < fixed < two
    # the ratio of the two jobs' times is S_full / S_plain once the fixed start is taken out, and below it with it
    assert (with_ablation - fixed) / (two - fixed) == pytest.approx(S_full / S_plain)
    assert 1 < with_ablation / two < S_full / S_plain
    # memory: the GPU's (the host's on a CPU job) grows with T at least by the two probability sets' 2 L H T^2 4
    # bytes, and by little more where they dominate; doubling T again grows it about 4x as much
    L, H = shape.n_layers, shape.n_heads
    probs = {T: 2 * L * H * T * T * 4 / 1e9 for T in (1024, 2048, 4096)}
    cost = {T: _band_cost(shape, device, seq_len=T, **full) for T in probs}
    memory = {T: c.device_gb if device == "gpu" else c.host_gb for T, c in cost.items()}
    for small, big in ((1024, 2048), (2048, 4096)):
        grew = memory[big] - memory[small]
        assert probs[big] - probs[small] <= grew < 1.5 * (probs[big] - probs[small]), (small, big)
        assert cost[big].seconds > cost[small].seconds
    assert 3.5 < (memory[4096] - memory[2048]) / (memory[2048] - memory[1024]) <= 4
    assert cost[4096].disk_gb < 1e-3  # a NetCDF of (setting, sample, layer, head) floats


def test_paper_plan_rows_and_totals():
    paper = load(ROOT / "config.paper.yaml")
    store = copy.deepcopy(paper)
    store["extract"].update(analysis="store", keep_qk="all", qk_dtype="float32")
    store["shards"] = 8
    rows = plan.plan(store, models_dir=ROOT / "no-models", device="gpu")
    # 4 models x 4 variants x 8 shards x (extract, decompose, bands) + x 4 perturb windows in 4 shards x (perturb, cap)
    # + x one head_ablation job + x one band_interventions job
    assert len(rows) == 16 * (8 * 3 + 4 * 2 + 1 + 1)
    total = plan.totals(rows)
    # every window's float32 q/k of every layer, the whole config: the ~1.5 TB of docs/slurm.md
    qk = sum(4 * 32 * plan_model.Shape.from_dict(SHAPES[m["name"]]).qk_bytes(4096) for m in paper["models"])
    # plus each shard's mean key over the held-out windows (Method A-shared), float32 (layer, kv_head, token, dim)
    shapes = [plan_model.Shape.from_dict(SHAPES[m["name"]]) for m in paper["models"]]
    heldout = sum(4 * 8 * sh.n_layers * sh.n_kv_heads * 4096 * sh.head_dim * 4 for sh in shapes)
    assert qk / 1e9 < total["disk_gb"] < 1.1 * qk / 1e9 + heldout / 1e9
    assert 1200 < total["disk_gb"] < 1800
    fused = copy.deepcopy(paper)
    fused["extract"].update(analysis="fused", keep_qk=1, qk_dtype="bfloat16")
    assert plan.totals(plan.plan(fused, models_dir=ROOT / "no-models"))["disk_gb"] < total["disk_gb"] / 10


def test_the_cpu_guard_prices_the_unsharded_jobs_by_their_one_plan_row():
    """A job of head_ablation or band_interventions has no shard wildcard; the no-GPU guard still finds its row."""
    from posgen.start_checks import cpu_price

    paper = load(ROOT / "config.paper.yaml")
    rows = [r for r in plan.plan(paper, device="cpu") if r.cost and r.cost.rule in sharding.UNSHARDED]
    assert {r.cost.rule for r in rows} == set(sharding.UNSHARDED)
    jobs = [(r.cost.rule, {"model": r.model, "variant": r.variant}) for r in rows]
    hours, priced = cpu_price(paper, jobs)
    assert priced == len(rows) and hours == pytest.approx(sum(r.cost.seconds for r in rows) / 3600)


def test_a_gpu_study_is_priced_no_faster_than_the_measured_small_classifier_rate(capsys):
    """The GPU floor prices the regime study near its measured wall time (318 s for its 151,470 classifier steps
    on an H200) and prices the decisive GPU experiment, config.ensemble.yaml merged over config.yaml as Snakemake
    merges them, within one 10-minute device call; without the floor both would cost seconds."""
    from posgen.synthetic.cost import GPU_STEP_FLOOR, study_cost

    merged = load(ROOT / "config.yaml", ROOT / "config.ensemble.yaml")["synthetic"]
    regime = study_cost(merged, "regime_study", "gpu")
    assert sum(r.classifiers * r.steps for r in regime) >= 151_470 * 0.9  # the budget cells' steps, the size cells'
    assert 318 <= 3600 * sum(r.device_hours for r in regime) < 1.1 * 318  # above the floor where the scaling is
    decisive = study_cost(merged, "decisive_gpu", "gpu")
    # distance and its count control (DEPOSIT_COUNT), 4 PEs x 3 seeds each, in each of the two experiments
    assert [(r.classifiers, r.steps, r.tokens) for r in decisive] == [(24, 4690, 122), (24, 4690, 122)]
    seconds = 3600 * sum(r.device_hours for r in decisive)
    assert seconds < 600
    distance_only = {**merged, "experiments": {**merged["experiments"]}}
    for name in ("d71-data-clean", "d71-data-faithful"):
        distance_only["experiments"][name] = {**merged["experiments"][name], "tasks": ["distance"]}
    alone = 3600 * sum(r.device_hours for r in study_cost(distance_only, "decisive_gpu", "gpu"))
    assert alone == pytest.approx(GPU_STEP_FLOOR * 24 * 4690) and alone < seconds
    plan.main(
        ["--configfile", str(ROOT / "config.yaml"), str(ROOT / "config.ensemble.yaml"), "--study", "decisive_gpu"]
    )
    assert "total: 48 classifiers" in capsys.readouterr().out


# The device-check report damaged (issue 53 item 2): the damage, the line posgen.plan prints, and whether the plans
# then use none of the report (the header says why) or all of it but the damaged field
def _edit(change):
    def damaged(text: str) -> str:
        report = json.loads(text)
        change(report)
        return json.dumps(report)

    return damaged


def _set(*keys, value):
    def change(report):
        for key in keys[:-1]:
            report = report[key]
        report[keys[-1]] = value

    return _edit(change)


REPORT = "docs/gpu/gpu-report.json"
UNUSED = "the plans do not use the report (the ASSUMED GPU rates and issue 38's H100 classifier rate instead)"
DAMAGED_REPORTS = {
    "truncated": (
        lambda text: text[: len(text) // 2],
        f"{REPORT}: not a readable JSON file (Expecting ",
        UNUSED,
    ),
    "forward-a-string": (
        _set("rates", "forward", value="fast"),
        f'{REPORT}: rates.forward is "fast", not a positive number',
        "the plans use the ASSUMED forward rate instead",
    ),
    "layers-a-string": (
        _set("rates", "classifier", "layers", value="six"),
        f'{REPORT}: rates.classifier.layers is "six", not a positive integer',
        "the plans use issue 38's H100 classifier rate instead",
    ),
    "steps-per-s-null": (
        _set("parts", "classifier", "float32_steps_per_s", value=None),
        f"{REPORT}: parts.classifier.float32_steps_per_s is null, not a positive number",
        "the plans use rates.classifier.seconds_per_step instead",
    ),
    "device-name-missing": (
        _edit(lambda report: report.pop("device_name")),
        f"{REPORT}: device_name is missing",
        UNUSED,
    ),
    "tiny-a-string": (_set("tiny", value="false"), f'{REPORT}: tiny is "false", not true or false', UNUSED),
}
PLAN_COMMANDS = {
    "totals": ["--configfile", "config.paper.yaml", "--totals"],
    "decisive_study": ["--configfile", "config.paper.yaml", "--study", "decisive_study"],
    "decisive_gpu": ["--configfile", "config.yaml", "config.ensemble.yaml", "--study", "decisive_gpu"],
}


@pytest.mark.parametrize("command", list(PLAN_COMMANDS))
@pytest.mark.parametrize("damage", list(DAMAGED_REPORTS))
def test_a_damaged_device_check_report_is_one_line_naming_the_field_and_its_fallback(
    damage, command, tmp_path, monkeypatch, capsys
):
    from posgen import rates

    edit, said, fallback = DAMAGED_REPORTS[damage]
    (tmp_path / "docs/gpu").mkdir(parents=True)
    (tmp_path / REPORT).write_text(edit((ROOT / REPORT).read_text()))
    monkeypatch.chdir(tmp_path)  # the message names the report relative to the working directory
    monkeypatch.setenv(rates.REPORT_ENV, str(tmp_path / REPORT))
    rates.forget_reports()
    try:
        plan.main([str(ROOT / arg) if arg.endswith(".yaml") else arg for arg in PLAN_COMMANDS[command]])
    finally:
        rates.forget_reports()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said) and lines[0].endswith(f"; {fallback}"), err
    assert out.strip().splitlines()[-1].startswith("total: ")
    if command == "totals" and fallback == UNUSED:  # the header says why the rates are assumed, not "no report"
        assert f"ASSUMED H100 rates, unmeasured ({REPORT} is " in out.splitlines()[0], out


def test_a_report_of_a_tiny_check_is_not_used_and_the_plan_says_so(tmp_path, monkeypatch, capsys):
    from posgen import rates

    report = json.loads((ROOT / REPORT).read_text())
    (tmp_path / "tiny.json").write_text(json.dumps({**report, "tiny": True}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(rates.REPORT_ENV, "tiny.json")
    rates.forget_reports()
    try:
        plan.main(["--configfile", str(ROOT / "config.paper.yaml"), "--totals"])
    finally:
        rates.forget_reports()
    out, err = capsys.readouterr()
    assert (
        not err and "(ASSUMED H100 rates, unmeasured (tiny.json is a --tiny check, which the plans do not use))" in out
    )


def test_cli_prints_jobs_and_totals(capsys):
    plan.main(["--configfile", str(ROOT / "config.yaml"), "--device", "cpu", "--models-dir", "no-models"])
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "extract" in out
    last = out.strip().splitlines()[-1]
    # 2 variants x extract and band_interventions, and perturb, cap, head_ablation on the trained weights
    # (config.yaml: their random_init false; band_interventions' true, the schema's default)
    assert last.startswith("total: 7 jobs, disk") and "reference logits" in last and "CPU-hours" in last
    assert sum(" random-seed0 " in line for line in out.splitlines()) == 2


def test_scale_bench_runs_the_stages_asked_for_and_the_fused_path_writes_no_qk(tmp_path, capsys):
    """`posgen.bench scale`, the command of the GPU run (docs/slurm.md), on a small shape on the CPU: the stages
    asked for only, per-window times of every window, and the fused stage writing only its NetCDFs."""
    from posgen.bench import scale

    argv = ["--shape", "smollm2-135m", "--layers", "1", "--seq-len", "96", "--windows", "2", "--threads", "1"]
    argv += ["--paper-config", str(tmp_path / "none.yaml")]
    stages = scale.main(argv + ["--stages", "forward", "extract", "fused"])
    assert list(stages) == ["plain forward", "extract (capture + HDF5)", "fused (extract + analysis)"]
    assert all(len(stage["per_window"]) == 2 and stage["peak_gpu_gb"] == 0 for stage in stages.values())
    one_layer = plan_model.Shape.from_dict({**SHAPES["smollm2-135m"], "num_hidden_layers": 1})
    qk_bytes = 2 * one_layer.qk_bytes(96)  # two windows' float32 q/k of the one layer
    assert stages["extract (capture + HDF5)"]["bytes"] > qk_bytes
    assert 0 < stages["fused (extract + analysis)"]["bytes"] < qk_bytes  # NetCDFs and a metadata-only qk.h5
    assert "1 of 30 layers, 2 window(s) x 96 tokens, cpu, float32" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        scale.main(argv + ["--stages", "decompose"])
    assert "decompose reads the qk.h5 that extract writes" in capsys.readouterr().err


def test_context_sweep_measures_every_stage_and_fits_exponents(capsys):
    """`posgen.bench scale --seq-lens`: one layer per T, every stage timed in its own process, Method B and the
    bound only up to their limits, and the least-squares exponent of each column (exact on a power law)."""
    from posgen.bench import context, scale

    swept = scale.main(["--seq-lens", "48", "96", "--shapes", "smollm2-135m", "--threads", "1", "--bound-max", "48"])
    rows = swept["smollm2-135m"]
    assert sorted(rows) == [48, 96]
    assert set(rows[48]) == {"forward", "capture", "moments", "method_b", "bound"} and "bound" not in rows[96]
    assert all(stage["seconds"] > 0 for row in rows.values() for stage in row.values())
    assert "exponent" in capsys.readouterr().out
    assert context.exponent([1024, 2048, 4096], [3.0, 12.0, 48.0]) == pytest.approx(2.0)
    assert context.exponent([1024, 2048], [1.0, float("nan")]) != context.exponent([1024, 2048], [1.0, 2.0])
