from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.models import acquire  # noqa: E402

entry = snakemake.params.entry
acquire(
    entry["source"],
    Path(snakemake.output.manifest).parent,
    trust_remote_code=entry["trust_remote_code"],
    allow_pickle=entry["allow_pickle"],
)
