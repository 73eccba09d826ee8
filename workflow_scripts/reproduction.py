from _common import setup

setup(snakemake)
from posgen.reproduction import write_reproduction  # noqa: E402

# the deposit study's summary and per-classifier table, or nothing when no run has built them
study = snakemake.input.study_summary
study = [study] if isinstance(study, str) else list(study)

write_reproduction(
    snakemake.input.summary,
    snakemake.output.csv,
    snakemake.output.md,
    snakemake.input.synthetic_summary,
    snakemake.output.synthetic_csv,
    study_summary_csv=study[0] if study else None,
    synthetic_classifiers_csv=snakemake.input.synthetic_classifiers,
    study_classifiers_csv=study[1] if study else None,
    bands_paths=list(snakemake.input.bands),
    perturb_paths=list(snakemake.input.perturb),
    cap_paths=list(snakemake.input.cap),
    block_swap_paths=list(snakemake.input.block_swap),
    config_hash=snakemake.params.config_hash,
)
