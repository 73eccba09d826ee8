"""Config validation (Snakemake's own JSON-schema validator) with one-line errors, and per-job config hashing."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"
VARIANT_TRAINED = "trained"


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

    names = [m["name"] for m in config["models"]]
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
    return config


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


def variants(config: dict) -> list[str]:
    """The extraction variants: the trained weights plus one random-init control per seed."""
    return [VARIANT_TRAINED] + [f"random-seed{s}" for s in config["random_init_seeds"]]


def init_seed(variant: str) -> int:
    """-1 for trained weights, S for ``random-seed<S>``."""
    if variant == VARIANT_TRAINED:
        return -1
    prefix = "random-seed"
    if not variant.startswith(prefix) or not variant[len(prefix) :].isdigit():
        raise ConfigError(f"variant {variant!r}: expected 'trained' or 'random-seed<S>'")
    return int(variant[len(prefix) :])


def model_entry(config: dict, name: str) -> dict:
    """The ``models`` entry named ``name``."""
    for m in config["models"]:
        if m["name"] == name:
            return m
    raise ConfigError(f"config.models: no model named {name!r}")
