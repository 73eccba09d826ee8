"""Config validation (Snakemake's own JSON-schema validator) with one-line errors, and per-job config hashing."""

from __future__ import annotations

import copy
import functools
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
# Top-level sections that were renamed: old -> new.
RENAMED_SECTIONS = {"llm_heads": "head_ablation"}


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


def validate(config: dict, schema: str | Path = SCHEMA, check_paths: bool = True) -> dict:
    """Validate ``config`` in place (filling schema defaults) and check cross-key rules.

    ``check_paths``: also check that ``local:`` model folders and corpus files exist. Only the main Snakemake
    process should: a cluster job re-reads the config on a node that may not see the login node's files.
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
    for old, new in RENAMED_SECTIONS.items():
        if old in config:
            raise ConfigError(f"config.{old}: renamed to {new} (rename the section `{old}:` to `{new}:`)")
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
    for section in ("perturb", "head_ablation", "band_interventions"):  # each reads a prefix of the first windows
        for key in ("seq_len", "n_samples"):
            if config[section][key] > config[key]:
                raise ConfigError(f"config.{section}.{key}: {config[section][key]} exceeds {key} {config[key]}")
    _check_cross_keys(config)
    _check_experiments(config["synthetic"], schema)
    if check_paths:
        for i, entry in enumerate(config["models"]):
            _check_model_source(entry, f"config.models[{i}].source")
        _check_corpus_source(config["corpus"]["source"])
    _check_trajectory(config)
    return config


def _check_cross_keys(config: dict) -> None:
    """Rules between keys that the schema cannot state; each names the key, its value and the limit."""
    perturb = config["perturb"]
    longest = perturb["seq_len"] - 1  # the largest query-key distance in a perturbation window
    for cap in perturb["caps"]:
        if cap >= longest:
            raise ConfigError(
                f"config.perturb.caps: cap {cap} never applies (the longest distance in a window of "
                f"perturb.seq_len {perturb['seq_len']} tokens is {longest}; use caps below {longest})"
            )
    for i, entry in enumerate(config["models"]):
        prefix = re.fullmatch(r"prefix(\d+)", entry.get("window_set", ""))
        if prefix and int(prefix[1]) >= config["seq_len"]:
            raise ConfigError(
                f"config.models[{i}].window_set: a prefix of {prefix[1]} tokens is not shorter than seq_len "
                f"{config['seq_len']}"
            )
    figures = config["figures"]
    if figures["map_tokens"] > config["seq_len"]:
        raise ConfigError(f"config.figures.map_tokens: {figures['map_tokens']} exceeds seq_len {config['seq_len']}")
    if figures["sample"] >= config["n_samples"]:
        raise ConfigError(
            f"config.figures.sample: sample {figures['sample']} does not exist (n_samples is {config['n_samples']})"
        )
    shards = config["shards"]
    if shards > config["n_samples"]:
        raise ConfigError(f"config.shards: {shards} exceeds n_samples {config['n_samples']} (a shard holds a window)")
    extract = config["extract"]
    if extract["analysis"] == "fused" and extract["keep_qk"] != "all" and figures["sample"] >= extract["keep_qk"]:
        raise ConfigError(
            f"config.figures.sample: sample {figures['sample']} is not kept in qk.h5 (extract.keep_qk is "
            f"{extract['keep_qk']}; raise it above {figures['sample']} or use keep_qk: all)"
        )
    bound = config["decomposition"]["bound_samples"]
    if bound > config["n_samples"]:
        raise ConfigError(f"config.decomposition.bound_samples: {bound} exceeds n_samples {config['n_samples']}")
    synthetic = config["synthetic"]
    count = synthetic["count"]
    if count["max_count"] > count["seq_len"]:
        raise ConfigError(
            f"config.synthetic.count.max_count: {count['max_count']} exceeds synthetic.count.seq_len {count['seq_len']}"
        )
    names = [entry["name"] for entry in config["models"]]
    for pair in config["confirmatory"]["pairs"]:
        unknown = [name for name in pair if name not in names]
        if unknown:
            raise ConfigError(f"config.confirmatory.pairs: no models entry {unknown[0]!r} (models: {', '.join(names)})")
    width, n_heads = synthetic["model"]["d_model"], synthetic["model"]["n_heads"]
    if width % n_heads:
        raise ConfigError(f"config.synthetic.model.d_model: {width} is not a multiple of n_heads {n_heads}")


def _check_experiments(synthetic: dict, schema) -> None:
    """Each experiment's resolved settings must satisfy the schema of the keys it overrides."""
    import jsonschema
    import yaml

    from posgen.experiments import UNUSED, ExperimentError, check, resolve

    properties = yaml.safe_load(Path(schema).read_text())["properties"]["synthetic"]["properties"]
    try:
        for name, overrides in synthetic["experiments"].items():
            options = resolve(synthetic, name)
            for key in (k for k in overrides if k != UNUSED):
                try:
                    jsonschema.validate(options[key], properties[key])
                except jsonschema.ValidationError as err:
                    where = ".".join(str(p) for p in err.absolute_path)
                    raise ConfigError(
                        f"config.synthetic.experiments.{name}.{key}{'.' + where if where else ''}: {err.message}"
                    ) from None
        check(synthetic)
    except ExperimentError as err:
        raise ConfigError(str(err)) from None


def _check_model_source(entry: dict, key: str) -> None:
    """A ``local:`` folder must exist and hold config.json and weights (else get_model would fail later)."""
    source = entry["source"]
    if not source.startswith("local:"):
        return
    folder = Path(source[len("local:") :]).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{key}: {folder} is not a directory")
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{key}: {folder} has no config.json")
    weights = ["*.safetensors"] + (["*.bin", "*.pt", "*.pth"] if entry.get("allow_pickle") else [])
    if not any(next(folder.glob(pattern), None) for pattern in weights):
        kinds = "safetensors" + (" or pickle" if entry.get("allow_pickle") else "")
        raise ConfigError(f"{key}: {folder} holds no {kinds} weights")


def _check_corpus_source(source: str) -> None:
    """Local corpus files must exist now, not only when the windows job runs."""
    import glob

    kind, _, spec = source.partition(":")
    if kind == "jsonl":
        path = Path(spec.rpartition(":")[0])
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise ConfigError(f"config.corpus.source: {path} {what}")
    elif kind == "text":
        files = [p for p in glob.glob(spec, recursive=True) if Path(p).is_file()]
        if not files:
            raise ConfigError(f"config.corpus.source: no file matches {spec!r}")


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys (plain YAML silently keeps the last value); merge keys
    (``<<: *anchor``) are allowed, and the mapping's own keys override the merged ones."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=True)
            # YTE templates repeat conditional keys (`?if`, `?else`) by design
            if isinstance(key, str) and key.startswith("?"):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _refuse_duplicate_json_keys(pairs):
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"duplicate key {dupes[0]!r}")
    return dict(pairs)


def read_yaml(path: str | Path) -> dict:
    """Read a config file (YAML or JSON) strictly: duplicate keys, syntax errors, an empty file or a top level
    that is not a mapping raise ConfigError with one line naming the file (and the line where YAML knows it)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config file ({err.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: not UTF-8 text") from None
    # Snakemake tries JSON first, then YAML; JSON's tabs would trip YAML
    try:
        config = json.loads(text, object_pairs_hook=_refuse_duplicate_json_keys)
    except json.JSONDecodeError:
        try:
            config = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            where = f", line {mark.line + 1} column {mark.column + 1}" if mark else ""
            problem = err.problem or err.context or "not valid YAML"
            if "\t" in problem or "'\\t'" in problem:
                problem += " (indent with spaces, not tabs)"
            raise ConfigError(f"{path}{where}: not valid YAML ({problem})") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except ValueError as err:  # a duplicate JSON key
        raise ConfigError(f"{path}: {err}") from None
    if config is None:
        raise ConfigError(f"{path}: config file is empty")
    if not isinstance(config, dict):
        raise ConfigError(
            f"{path}, line 1: expected a mapping of keys at the top level, found a {type(config).__name__}"
        )
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


def load(*paths: str | Path) -> dict:
    """Read (strictly, see :func:`read_yaml`) and validate config files, each merged over the ones before it key by
    key, as Snakemake merges ``--configfile`` files; the files after the first are overlays (:func:`check_overlays`)."""
    config = {}
    for path in paths:
        merge(config, read_yaml(path))
    validate(config)
    check_overlays(config, paths[1:])
    return config


def check_overlays(config: dict, overlays) -> None:
    """Refuse, in one line naming the file, an overlay (a config file merged over config.yaml) that names an
    experiment no collection of the merged config trains: a misspelt name (``d71-data-claen``) is otherwise a new
    experiment nothing trains, and the one meant keeps its old settings without a word. An experiment kept on
    purpose says ``unused: true``."""
    from posgen.experiments import COLLECTIONS, UNUSED

    synthetic = config["synthetic"]
    trained = {name for which in COLLECTIONS for name in synthetic[which]}
    for path in overlays:
        named = (read_yaml(path).get("synthetic") or {}).get("experiments") or {}
        for name, settings in named.items():
            if name not in trained and not (settings or {}).get(UNUSED):
                raise ConfigError(
                    f"{path}: synthetic.experiments.{name}: no collection of the merged config trains it (trained: "
                    f"{', '.join(sorted(trained))}); a misspelt name? An experiment kept on purpose: unused: true"
                )


def merge(config: dict, overlay: dict) -> dict:
    """``overlay`` merged into ``config`` in place: a mapping key by key, anything else replaced."""
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merge(config[key], value)
        else:
            config[key] = copy.deepcopy(value)
    return config


def check_files(paths) -> None:
    """Read every config file of ``paths`` strictly; the first problem raises ConfigError (one line)."""
    for path in paths:
        read_yaml(path)


def configfiles_in_argv(argv: list[str]) -> list[str]:
    """The files a Snakemake command line passes with ``--configfile(s)`` (several may follow one flag)."""
    files, taking = [], False
    for arg in argv:
        if arg == "--":
            break
        if arg in ("--configfile", "--configfiles"):
            taking = True
        elif arg.startswith(("--configfile=", "--configfiles=")):
            files.append(arg.partition("=")[2])
            taking = False
        elif arg.startswith("-"):
            taking = False
        elif taking:
            files.append(arg)
    return files


def precheck_command_line(argv: list[str] | None = None) -> None:
    """Check the ``--configfile`` files of a Snakemake command line before Snakemake parses them.

    Snakemake reads them before the Snakefile runs, and words a YAML error without the file or line (a missing
    file as a traceback). Called from the workflow profile (profiles/default): a problem prints one line and
    exits with status 1.
    """
    import sys

    try:
        check_files(configfiles_in_argv(sys.argv[1:] if argv is None else argv))
    except ConfigError as err:
        print(f"ConfigError: {err}", file=sys.stderr)
        raise SystemExit(1) from None


def config_hash(config: dict, keys: list[str] | None = None) -> str:
    """sha256 (16 hex digits) of the canonical JSON of ``config`` (or of its ``keys``)."""
    sub = copy.deepcopy(config if keys is None else {k: config.get(k) for k in keys})
    blob = json.dumps(sub, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@functools.cache
def _schema_properties() -> dict:
    # read once: the resource functions of every job ask (posgen.plan.config_options)
    return yaml.safe_load(SCHEMA.read_text())["properties"]


def _schema_node(path: str) -> dict:
    node = {"properties": _schema_properties()}
    for key in path.split("."):
        node = node.get("properties", {}).get(key)
        if node is None:
            raise KeyError(f"config.{path}: not in the schema")
    return node


def schema_default(path: str):
    """The schema's default of dotted leaf ``path`` (the one place defaults are written)."""
    node = _schema_node(path)
    if "default" not in node:
        raise KeyError(f"config.{path}: no schema default")
    return copy.deepcopy(node["default"])


def schema_defaults(section: str, keys=None) -> dict:
    """The schema's default of each key of config ``section`` that has one (of ``keys`` only, when given): for a
    caller of a library function outside the workflow, which takes every config leaf as a required keyword
    argument."""
    properties = _schema_node(section)["properties"]
    keys = [key for key, spec in properties.items() if "default" in spec] if keys is None else list(keys)
    return {key: schema_default(f"{section}.{key}") for key in keys}


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
