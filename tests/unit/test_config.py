import copy

import pytest
import yaml

from posgen.config import ConfigError, config_hash, job_hash, leaf, load, schema_defaults, validate
from posgen.testing.runs import ROOT
from posgen.workflow.steps import STEPS, leaves, step_leaves

BASE = yaml.safe_load((ROOT / "config.yaml").read_text())


def test_default_config_validates_and_fills_defaults():
    config = validate(copy.deepcopy(BASE))
    assert config["extract"]["ref_layers"] == [0, -1]
    assert config["extract"]["check_rtol"] == pytest.approx(1e-4)
    assert config["decomposition"]["dummy_distance"] == 1000
    assert config["intervals"] == {"bootstrap": 1000, "seed": 0}
    assert config["models"][0]["trust_remote_code"] is False


def _set(path, value):
    def edit(config):
        node = config
        for key in path[:-1]:
            node = node[key]
        if value is DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return edit


DELETE = object()

MALFORMED = [
    (_set(["models"], DELETE), "config: 'models' is a required property"),
    (_set(["models"], []), "config.models:"),
    (_set(["models", 0, "source"], "ftp:smollm2"), "config.models[0].source:"),
    (_set(["models", 0, "name"], "my model"), "config.models[0].name:"),
    (_set(["models", 0, "colour"], "red"), "config.models[0]: unknown key(s) 'colour'"),
    (_set(["n_samples"], 0), "config.n_samples:"),
    (_set(["seq_len"], "long"), "config.seq_len:"),
    (_set(["dtype"], "float64"), "config.dtype:"),
    (_set(["device"], "tpu"), "config.device:"),
    (_set(["sampels"], 3), "config: unknown key(s) 'sampels'"),
    (_set(["corpus", "source"], "s3://bucket"), "config.corpus.source:"),
    (_set(["random_init_seeds"], [-1]), "config.random_init_seeds[0]:"),
    (_set(["extract"], {"ref_samples": [9]}), "config.extract.ref_samples: sample 9 does not exist"),
    (_set(["decomposition"], {"dummy_distances": []}), "config.decomposition.dummy_distances:"),
    (lambda c: c["models"].append(dict(c["models"][0])), "config.models: duplicate model name(s) smollm2-135m"),
    (
        _set(["decomposition"], {"default_D": 500}),
        "config.decomposition.default_D: renamed to decomposition.dummy_distance",
    ),
    (_set(["decomposition"], {"bootstrap": 500}), "config.decomposition.bootstrap: renamed to intervals.bootstrap"),
    (_set(["decomposition"], {"bootstrap_seed": 1}), "config.decomposition.bootstrap_seed: renamed to intervals.seed"),
    (
        _set(["llm_heads"], {"n_samples": 2}),
        "config.llm_heads: renamed to head_ablation (rename the section `llm_heads:` to `head_ablation:`)",
    ),
    (_set(["intervals"], {"bootstrap": 10}), "config.intervals.bootstrap:"),
]


@pytest.mark.parametrize(
    "edit, expected", MALFORMED, ids=[m[1].split(":")[0] + str(i) for i, m in enumerate(MALFORMED)]
)
def test_malformed_config_gives_one_line_naming_the_key(edit, expected):
    config = copy.deepcopy(BASE)
    edit(config)
    with pytest.raises(ConfigError) as info:
        validate(config)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(expected), message


def test_load_reports_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)


def test_config_hash_depends_only_on_selected_keys():
    a = validate(copy.deepcopy(BASE))
    b = copy.deepcopy(a)
    b["intervals"]["bootstrap"] = 5000
    keys = ["models", "n_samples", "seq_len"]
    assert config_hash(a, keys) == config_hash(b, keys)
    b["seq_len"] = 64
    assert config_hash(a, keys) != config_hash(b, keys)


def test_job_hash_covers_exactly_its_leaves_and_its_own_model():
    a = validate(copy.deepcopy(BASE))
    leaves = ["decomposition.dummy_distance", "perturb.rates", "dtype"]
    before = job_hash(a, leaves, "smollm2-135m")
    assert len(before) == 16 and before != job_hash(a, leaves) != job_hash(a, leaves[:2], "smollm2-135m")
    b = copy.deepcopy(a)
    b["intervals"]["bootstrap"] = 500  # a leaf the job does not read
    b["perturb"]["caps"] = [2]  # a sibling of a leaf it reads
    b["models"].append({"name": "other", "source": "embedded:gemma3-270m"})  # another model
    assert job_hash(b, leaves, "smollm2-135m") == before
    b["perturb"]["rates"] = [0, 0.5]
    assert job_hash(b, leaves, "smollm2-135m") != before
    c = copy.deepcopy(a)
    c["models"][0]["trust_remote_code"] = True  # the job's own model entry
    assert job_hash(c, leaves, "smollm2-135m") != before
    assert leaf(a, "perturb.rates") == a["perturb"]["rates"]
    with pytest.raises(ConfigError, match=r"^config\.perturb\.speed: missing$"):
        leaf(a, "perturb.speed")
    with pytest.raises(ConfigError, match="no model named 'nope'"):
        job_hash(a, leaves, "nope")


def test_paths_are_checked_only_when_asked(tmp_path):
    config = copy.deepcopy(BASE)
    config["models"][0]["source"] = f"local:{tmp_path}/gone"
    with pytest.raises(ConfigError, match=rf"^config\.models\[0\]\.source: {tmp_path}/gone is not a directory$"):
        validate(copy.deepcopy(config))
    validate(config, check_paths=False)  # a cluster job: its node may not see the login node's files


def test_every_step_reads_schema_leaves_and_the_library_takes_them_without_defaults():
    import dataclasses

    from posgen.llm.options import CapOptions, ExtractOptions, HeadAblationOptions, PerturbOptions

    config = validate(copy.deepcopy(BASE))
    for step in STEPS:
        for path in step_leaves(step, config).values():
            leaf(config, path)  # every leaf a step reads exists once the schema's defaults are filled in
    assert set(step_leaves("extract", config)) >= set(STEPS["decompose"].leaves)  # the fused path
    # each model job's options (posgen.llm.options): its fields without a default are leaves of its step, and the
    # options built from the step's params (the default config's) are the schema's defaults
    schema_only = validate({k: v for k, v in BASE.items() if k not in ("extract", "perturb", "head_ablation")})
    for cls in (ExtractOptions, PerturbOptions, CapOptions, HeadAblationOptions):
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        assert set(required) <= set(STEPS[cls.STEP].leaves), cls.__name__
        params = {name: leaf(schema_only, path) for name, path in step_leaves(cls.STEP, schema_only).items()}
        built, defaults = cls.of({**params, **STEPS[cls.STEP].entry}), cls.defaults()
        assert [getattr(built, name) for name in required] == [getattr(defaults, name) for name in required]
    with pytest.raises(TypeError, match="not an option of extract: nope"):
        ExtractOptions.defaults(nope=1)
    assert schema_defaults("decomposition", ["bound_samples"]) == {"bound_samples": 2}
    with pytest.raises(KeyError, match="config.perturb.nope: not in the schema"):
        schema_defaults("perturb", ["nope"])
    assert leaves("perturb.caps", seed="window_seed") == {"caps": "perturb.caps", "seed": "window_seed"}
    with pytest.raises(ValueError, match="two leaves under the param name"):
        leaves("perturb.seed", seed="window_seed")


def test_the_ensemble_overlay_packs_exactly_the_gpu_studies():
    """config.ensemble.yaml over config.yaml (Snakemake merges config files key by key): a valid config in which
    the regime study's and the decisive GPU experiment's experiments, and only they, train their seeds as one
    ensemble job, their own train options kept; the decisive GPU experiment's in bfloat16."""
    from snakemake.utils import update_config

    from posgen.experiments import resolve

    merged = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(merged, yaml.safe_load((ROOT / "config.ensemble.yaml").read_text()))
    synthetic = validate(merged, check_paths=False)["synthetic"]
    packed = {name for name in synthetic["experiments"] if resolve(synthetic, name)["train"]["ensemble"]}
    assert packed == set(synthetic["regime_study"]) | set(synthetic["decisive_gpu"])
    bfloat16 = {
        name for name in synthetic["experiments"] if resolve(synthetic, name)["train"]["precision"] == "bfloat16"
    }
    assert bfloat16 == set(synthetic["decisive_gpu"])
    assert resolve(synthetic, "d71-data-faithful")["train"]["betas"] == [0.98, 0.9]  # merged, not replaced
    assert resolve(synthetic, "budget-10x-lr1e-3")["train"]["epochs"] == 100
    assert resolve(synthetic, "budget-10x-lr1e-3")["train"]["lr"] == pytest.approx(1e-3)


def test_a_window_set_is_checked_and_passed_only_where_an_entry_sets_it():
    """A models entry's window_set (docs/method.md 3E): refused when its prefix is not shorter than the windows or
    its name is not a window set; rule windows passes it only in a config where an entry sets it, so a config
    without one keeps its params (and reruns nothing)."""
    from types import SimpleNamespace

    from posgen.workflow.steps import params_of

    plain = validate(copy.deepcopy(BASE))
    assert "window_set" not in params_of("windows", plain)
    config = copy.deepcopy(BASE)
    config["models"].append({"name": "smollm2-prefix", "source": "embedded:smollm2-135m", "window_set": "prefix300"})
    config = validate(config)
    params = params_of("windows", config)
    assert params["window_set"](SimpleNamespace(model="smollm2-prefix")) == "prefix300"
    assert params["window_set"](SimpleNamespace(model="smollm2-135m")) == "corpus"
    assert params["config_hash"](SimpleNamespace(model="smollm2-135m")) == params_of("windows", plain)["config_hash"](
        SimpleNamespace(model="smollm2-135m")
    )
    for window_set, message in (("prefix1200", "is not shorter than seq_len 1200"), ("prefix", "does not match")):
        bad = copy.deepcopy(BASE)
        bad["models"][0]["window_set"] = window_set
        with pytest.raises(ConfigError, match=message):
            validate(bad)
