"""The prepared device check (python -m posgen.bench gpu) on the CPU at tiny sizes, its budget, and the plan
reading a committed report's measured rates."""

from __future__ import annotations

import json

import pytest

from posgen import rates as device
from posgen.bench import gpu
from posgen.rates import gpu_report
from posgen.synthetic import cost


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--budget-s", "2400", "--threads", "1"])
    return out


def test_tiny_device_check_writes_both_reports(tiny_report):
    report = json.loads((tiny_report / "gpu-report.json").read_text())
    assert report["device"] == "cpu" and report["tiny"] and not report["did_not_fit"] and not report["failed"]
    full = report["parts"]["full_depth"]
    forward, fused = full["plain forward"], full["fused (extract + analysis)"]
    assert forward["seconds"] > 0 and fused["seconds"] > 0 and forward["init_s_per_billion"] > 0
    assert {"moments", "method_b", "bound"} <= set(fused["steps"])
    # the window's other work beside the analysis steps, each without the steps inside it: they add up to the
    # windows' time, "rest" what no step accounts for (the loop itself, the RoPE table after the first pass)
    assert {"capture", "copies", "self_check", "bands", "to_host", "rest"} <= set(fused["steps"])
    assert fused["steps"]["capture"] > 0 and fused["steps"]["copies"] > 0
    assert sum(fused["steps"].values()) == pytest.approx(sum(fused["per_window"]))
    assert 0 <= fused["steps"]["rest"] < 0.2 * sum(fused["per_window"])
    assert set(fused["once_per_shard"]) == {"transparency", "held_out"}
    assert report["parts"]["long_window"]["setup"][2] == 512
    layouts = report["parts"]["layouts"]
    assert layouts["device"]["syncs"] == 0 < layouts["host"]["syncs"]
    assert layouts["device"]["ops"] < layouts["host"]["ops"] and layouts["max_rel_difference"] < 1e-6
    classifier = report["parts"]["classifier"]
    assert classifier["float32_steps_per_s"] > 0 and classifier["ensemble_members"] == 3
    # bfloat16 through torch.compile beside eager; the plan keeps the eager rate the workflow trains with
    assert classifier["bfloat16_compiled_steps_per_s"] > 0
    assert classifier["compiled_over_eager"] == pytest.approx(
        classifier["bfloat16_compiled_steps_per_s"] / classifier["bfloat16_steps_per_s"]
    )
    rates = report["rates"]
    assert rates["forward"] > 0 and rates["moments"] > 0 and rates["error"] > 0
    assert rates["classifier"]["seconds_per_step"] == pytest.approx(
        1 / max(classifier["float32_steps_per_s"], classifier["bfloat16_steps_per_s"])
    )
    markdown = (tiny_report / "gpu-report.md").read_text()
    assert "| full_depth: smollm2-135m x 2 layers, 2 x 128 tokens | plain forward |" in markdown
    assert "Rates for posgen.plan" in markdown
    assert "| device |" in markdown and "device / host time" in markdown
    # the paper smoke: the workflow through Snakemake, every first-paper step, its results current
    smoke = report["parts"]["paper_smoke"]
    assert smoke["jobs"] > 0 and smoke["targets"] > 0 and smoke["missing"] == 0 and smoke["integrity"]["current"], smoke
    assert {"extract", "perturb", "cap", "head_ablation", "summarize"} <= set(smoke["rules"])
    assert "Paper smoke (smollm2-135m x 2 layers" in markdown


def test_a_part_past_its_budget_is_reported_not_waited_for(tmp_path):
    report = gpu.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--budget-s", "1"])
    assert "full_depth plain forward" in report["did_not_fit"] and "classifier" in report["did_not_fit"]
    assert report["seconds"] < 60
    assert "Did not fit the budget" in (tmp_path / "gpu-report.md").read_text()
    assert report["rates"] == {}


def test_plan_uses_a_committed_cuda_report_and_labels_the_rest_assumed(tiny_report, tmp_path, monkeypatch):
    # a tiny CPU report does not count
    assert gpu_report(tiny_report / "gpu-report.json") is None
    report = json.loads((tiny_report / "gpu-report.json").read_text())
    report |= {"device": "cuda", "tiny": False, "device_name": "NVIDIA H100 80GB HBM3"}
    path = tmp_path / "gpu-report.json"
    path.write_text(json.dumps(report))
    committed = gpu_report(path)
    rates, label = device.device_rates("gpu", committed)
    assert rates.forward == pytest.approx(report["rates"]["forward"]) and rates.factor == device.GPU.factor
    assert "MEASURED on NVIDIA H100 80GB HBM3" in label and "ASSUMED: factor, memory, disk, start_s" in label
    assert device.device_rates("gpu", None) == (
        device.GPU,
        "ASSUMED H100 rates, unmeasured (no docs/gpu/gpu-report.json)",
    )
    # the classifiers' plan takes the measured step time and packing
    monkeypatch.setattr(cost, "gpu_report", lambda: committed)
    (seconds, layers, batch, tokens), packing, where = cost.reference("gpu")
    measured = report["rates"]["classifier"]
    # the rate of the precision the experiments train in (float32 by default) ...
    assert (seconds, layers, batch, tokens) == (
        1 / report["parts"]["classifier"]["float32_steps_per_s"],
        measured["layers"],
        measured["batch"],
        measured["tokens"],
    )
    assert "float32 rate MEASURED" in where
    # ... or, where the check did not measure it (no TF32 on a CPU), its fastest, named
    (seconds, *_), _, where = cost.reference("gpu", "tf32")
    assert seconds == measured["seconds_per_step"] and where.startswith(f"{measured['precision']} rate")
    assert packing == pytest.approx(max(1.0, measured["jobs_per_device"])) and "MEASURED" in where
    # an ensemble slower than one classifier after another (H200, authors' size: 0.80) packs nothing
    slow = {**committed, "rates": {**committed["rates"], "classifier": {**measured, "jobs_per_device": 0.8}}}
    monkeypatch.setattr(cost, "gpu_report", lambda: slow)
    assert cost.reference("gpu")[1] == 1.0


def test_an_unreadable_report_names_its_file_and_is_not_used(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpu-report.json").write_text("{not json")
    assert gpu_report("gpu-report.json") is None
    assert device.unused_because("gpu-report.json") == "gpu-report.json is unreadable"
    err = capsys.readouterr().err
    assert err.startswith("gpu-report.json: not a readable JSON file (") and err.count("\n") == 1, err


def test_a_failed_part_says_where_it_stopped():
    from posgen.bench.context import in_child
    from posgen.bench.gpu import attempt
    from posgen.synthetic.cost import tokens_of

    # in this process: the innermost frame of posgen's own code
    failed = attempt(tokens_of, {}, "distance")["failed"]
    assert failed.startswith("KeyError: 'distance' (at synthetic/cost.py:") and failed.endswith("in tokens_of)")
    # in a spawned child (as every part runs): from the traceback multiprocessing sends back
    failed = attempt(in_child, tokens_of, {}, "count")["failed"]
    assert failed.startswith("KeyError: 'count' (at synthetic/cost.py:") and failed.endswith("in tokens_of)")
