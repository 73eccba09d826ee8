"""The tiny end-to-end run of the whole workflow, its idempotence, lint, and config errors through Snakemake."""

import re

from conftest import make_run, tiny_config
from posgen.store import open_dataset


def test_tiny_run_produces_every_extraction(tiny_workflow):
    for variant in ["trained", "random-seed0"]:
        ds = open_dataset(tiny_workflow.workdir / f"results/tiny-llama/{variant}/qk.h5")
        assert ds.sizes["sample"] == 3 and ds.sizes["token"] == 48
        assert ds.attrs["self_check_max_rel_error"] <= 1e-4
        assert ds.attrs["variant"] == variant and len(ds.attrs["config_hash"]) == 16
    logs = sorted(p.relative_to(tiny_workflow.workdir).as_posix() for p in (tiny_workflow.workdir / "logs").rglob("*.log"))
    assert "logs/extract/tiny-llama/trained.log" in logs
    assert "extract tiny-llama/trained: 100%" in (tiny_workflow.workdir / logs[logs.index("logs/extract/tiny-llama/trained.log")]).read_text()


def test_second_run_has_nothing_to_do(tiny_workflow):
    proc = tiny_workflow.snakemake("--cores", "2", "--dry-run")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_lint_is_clean(tiny_workflow):
    proc = tiny_workflow.snakemake("--lint", check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Lints for" not in output, output[-3000:]


def test_bad_config_stops_snakemake_with_one_line_naming_the_key(tmp_path, tiny_source):
    config = tiny_config(tiny_source("llama"))
    config["seq_len"] = -5
    run = make_run(tmp_path, config)
    proc = run.snakemake("--cores", "1", "--dry-run", check=False)
    assert proc.returncode != 0
    assert re.search(r"config\.seq_len: -5 is less than the minimum of 8", proc.stderr + proc.stdout)
