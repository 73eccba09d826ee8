"""Config validation (Snakemake's own JSON-schema validator) with one-line errors, and per-job config hashing."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"
VARIANT_TRAINED = "trained"
TRAIN_SOURCE = "train"  # a trajectory model trained by the workflow (rule train_trajectory)


# Keys that were moved or renamed: (section, old key) -> new dotted key. A config still using one stops with a
# line naming the new key instead of the schema's generic "unknown key".
RENAMED = {
    ("decomposition", "default_D"): "decomposition.dummy_distance",
    ("decomposition", "bootstrap"): "intervals.bootstrap",
    ("decomposition", "bootstrap_seed"): "intervals.seed",
}


class ConfigError(ValueError):
    """A config problem, phrased as one line that names the offending key."""


def _key_path(error) -> str:
    parts = ["config"]
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else f".{p}")
    return "".join(parts)


def _one_line(error) -> str:
    if error.validator == "additionalProperties":
        # jsonschema words this "Additional properties are not allowed ('x' was unexpected)"
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"{_key_path(error)}: unknown key(s) {', '.join(map(repr, extra))}"
    if error.validator == "required":
        return f"{_key_path(error)}: {error.message}"
    described = error.schema.get("description")
    hint = f" (expected {described})" if described and error.validator == "pattern" else ""
    return f"{_key_path(error)}: {error.message}{hint}"


def validate(config: dict, schema: str | Path = SCHEMA) -> dict:
    """Validate ``config`` in place (filling schema defaults) and check cross-key rules.

    Raises ConfigError with a single line naming the key.
    """
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate as snakemake_validate

    if not isinstance(config, dict):
        raise ConfigError("config: expected a mapping at the top level")
    for (section, old), new in RENAMED.items():
        if isinstance(config.get(section), dict) and old in config[section]:
            raise ConfigError(f"config.{section}.{old}: renamed to {new}")
    try:
        snakemake_validate(config, str(schema), set_default=True)
    except WorkflowError as err:
        # Snakemake re-raises jsonschema's error as a multi-line WorkflowError; the original is its context.
        cause = err.__context__
        if not isinstance(cause, jsonschema.ValidationError):
            raise ConfigError(f"config: {str(err).splitlines()[0]}") from None
        best = jsonschema.exceptions.best_match([cause])
        raise ConfigError(_one_line(best)) from None

    names = [m["name"] for m in config["models"]] + trajectory_models(config)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"config.models: duplicate model name(s) {', '.join(dupes)}")
    for i in config["extract"]["ref_samples"]:
        if i >= config["n_samples"]:
            raise ConfigError(
                f"config.extract.ref_samples: sample {i} does not exist (n_samples is {config['n_samples']})"
            )
    for section in ("perturb", "llm_heads"):  # both read a prefix of the first windows
        for key in ("seq_len", "n_samples"):
            if config[section][key] > config[key]:
                raise ConfigError(f"config.{section}.{key}: {config[section][key]} exceeds {key} {config[key]}")
    _check_trajectory(config)
    return config


def _check_trajectory(config: dict) -> None:
    """Cross-key rules of the ``trajectory`` section."""
    section = config["trajectory"]
    for i, entry in enumerate(section["models"]):
        key = f"config.trajectory.models[{i}]"
        if entry["source"] == TRAIN_SOURCE and entry.get("revisions"):
            raise ConfigError(f"{key}.revisions: a model trained by the workflow has checkpoints, not revisions")
        if entry["source"] != TRAIN_SOURCE:
            if not entry.get("revisions"):
                raise ConfigError(f"{key}.revisions: a hub or local checkpoint series needs a list of revisions")
            steps = [revision_variant(r) for r in entry["revisions"]]
            if len(set(steps)) != len(steps):
                raise ConfigError(f"{key}.revisions: two revisions name the same step")
    missing = sorted(set(section["sensitivity_rates"]) - set(config["perturb"]["rates"]))
    if missing and section["models"]:  # read only by the trajectory table
        raise ConfigError(f"config.trajectory.sensitivity_rates: {missing} not among perturb.rates")


def load(path: str | Path) -> dict:
    """Read and validate a YAML config file."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    return validate(config if config is not None else {})


def config_hash(config: dict, keys: list[str] | None = None) -> str:
    """sha256 (16 hex digits) of the canonical JSON of ``config`` (or of its ``keys``)."""
    sub = copy.deepcopy(config if keys is None else {k: config.get(k) for k in keys})
    blob = json.dumps(sub, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def leaf(config: dict, path: str):
    """The value at dotted ``path`` (``"perturb.rates"``); a missing key is a ConfigError naming it."""
    node = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise ConfigError(f"config.{path}: missing")
        node = node[key]
    return node


def job_hash(config: dict, leaves: list[str], model: str | None = None) -> str:
    """Hash of exactly the config ``leaves`` (dotted paths) a job reads, plus model ``model``'s own entry.

    Recorded as ``config_hash`` in the job's outputs. Keys the job does not read, and the other models' entries,
    stay out, so editing them neither changes the hash nor reruns the job.
    """
    picked = {path: leaf(config, path) for path in leaves}
    if model is not None:
        picked["models[name]"] = model_entry(config, model)
    return config_hash(picked)


def variants(config: dict, model: str | None = None) -> list[str]:
    """The extraction variants of ``model`` (None: of every ``models`` entry).

    An ordinary model: its trained weights plus one random-init control per seed. A trajectory model
    (``trajectory.models``): one ``step<N>`` per checkpoint, in step order; one trained by the workflow also
    gets the random-init control of its training seed, which step 0 must equal.
    """
    if model is None or not is_trajectory_model(config, model):
        return [VARIANT_TRAINED] + [f"random-seed{s}" for s in config["random_init_seeds"]]
    entry = model_entry(config, model)
    if entry["source"] == TRAIN_SOURCE:
        steps = [f"step{n}" for n in sorted(entry["train"]["checkpoints"])]
        return [f"random-seed{entry['train']['seed']}"] + steps
    return [revision_variant(r) for r in entry["revisions"]]


def revision_variant(revision: str) -> str:
    """``step<N>`` of a hub revision named ``step<N>...`` (Pythia ``step1000``, OLMo ``step1000-tokens4B``)."""
    match = re.match(r"step(\d+)", revision)
    if not match:
        raise ConfigError(f"revision {revision!r}: expected a name starting with step<N>")
    return f"step{int(match.group(1))}"


def variant_step(variant: str) -> int | None:
    """N for ``step<N>``, None for any other variant."""
    match = re.fullmatch(r"step(\d+)", variant)
    return int(match.group(1)) if match else None


def init_seed(variant: str) -> int:
    """-1 for trained weights (``trained`` and every ``step<N>`` checkpoint), S for ``random-seed<S>``."""
    if variant == VARIANT_TRAINED or variant_step(variant) is not None:
        return -1
    prefix = "random-seed"
    if not variant.startswith(prefix) or not variant[len(prefix) :].isdigit():
        raise ConfigError(f"variant {variant!r}: expected 'trained', 'random-seed<S>' or 'step<N>'")
    return int(variant[len(prefix) :])


def variant_order(variant: str) -> tuple[int, int]:
    """Sort key: trained first, then random-init seeds, then checkpoints, each in numeric order."""
    step = variant_step(variant)
    if step is not None:
        return (2, step)
    seed = init_seed(variant)
    return (0 if seed < 0 else 1, seed)


def trajectory_models(config: dict) -> list[str]:
    """Names of the ``trajectory.models`` entries (built by the ``trajectory`` target, not by ``all``)."""
    return [m["name"] for m in config.get("trajectory", {}).get("models", [])]


def is_trajectory_model(config: dict, name: str) -> bool:
    return name in trajectory_models(config)


def model_entry(config: dict, name: str) -> dict:
    """The ``models`` (or ``trajectory.models``) entry named ``name``."""
    for m in config["models"] + config.get("trajectory", {}).get("models", []):
        if m["name"] == name:
            return m
    raise ConfigError(f"config.models: no model named {name!r}")
