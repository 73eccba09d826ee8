from pathlib import Path

from _common import setup

setup(snakemake)
from transformers import AutoTokenizer  # noqa: E402

from posgen.corpus import cut_windows, load_text  # noqa: E402
from posgen.store import provenance, write_netcdf  # noqa: E402

p = snakemake.params
tokenizer = AutoTokenizer.from_pretrained(Path(snakemake.input.manifest).parent)
windows = cut_windows(load_text(p.source), tokenizer, p.n_samples, p.seq_len, p.seed, p.source)
windows.attrs.update(provenance(config_hash=p.config_hash, model=snakemake.wildcards.model))
write_netcdf(windows, snakemake.output.windows)
