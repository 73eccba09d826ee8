import re
import sys
from pathlib import Path

# The library lives beside the workflow; make it importable without an install.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from posgen.config import validate as validate_config, variants, config_hash  # noqa: E402

validate_config(config, Path(workflow.basedir) / "schemas" / "config.schema.yaml")

MODELS = [m["name"] for m in config["models"]]
VARIANTS = variants(config)
# Hash of the keys that define the extracted data; recorded in every output (a params change reruns a job,
# so unrelated keys such as figure settings stay out of it).
WINDOWS_KEYS = ["models", "corpus", "n_samples", "seq_len", "window_seed"]
WINDOWS_HASH = config_hash(config, WINDOWS_KEYS)
CONFIG_HASH = config_hash(config, WINDOWS_KEYS + ["dtype", "extract"])
TARGETS = []


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS),
    variant=r"trained|random-seed\d+",


def model_entry(wildcards):
    return next(m for m in config["models"] if m["name"] == wildcards.model)
