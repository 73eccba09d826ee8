from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.models import acquire, acquire_series  # noqa: E402

entry = snakemake.params.entry
options = dict(trust_remote_code=entry["trust_remote_code"], allow_pickle=entry["allow_pickle"])
dest = Path(snakemake.output.manifest).parent
if entry.get("revisions"):  # a checkpoint series (trajectory.models): one step<N> folder per revision
    acquire_series(entry["source"], entry["revisions"], dest, **options)
else:
    acquire(entry["source"], dest, **options)
