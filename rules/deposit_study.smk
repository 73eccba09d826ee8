# The deposit study (README "The deposit study", docs/method.md section 8.8): the experiments of config
# `synthetic.deposit_study` go through the rules of rules/synthetic.smk (their files gathered under
# results/synthetic/deposit_study/); this file adds the study's figures and the named target `deposit_study`,
# which also rewrites results/reproduction.md with a verdict per claim from the study. Rule `all` never asks for
# any of it.

for row in [*STUDY_FIGURES.values(), *REGIME_FIGURES.values()]:

    rule:
        name:
            f"fig_{row.name}"
        input:
            **row.inputs,
        output:
            png=report(
                row.output("png"),
                caption=f"../{row.caption}",
                category=row.category,
                subcategory="deposit study" if row.name in STUDY_FIGURES else "regime study",
                labels={"figure": row.name},
            ),
            pdf=row.output("pdf"),
        log:
            row.log,
        localrule: True
        conda:
            "../envs/posgen.yaml"
        params:
            figure=row.name,
            variants=[],
            n_boot=None,
            seed=None,
            config_hash=hash_of([], per_model=False),
        script:
            "../workflow_scripts/figure.py"


localrules:
    deposit_study,
    regime_study,
    decisive_study,


rule deposit_study:
    input:
        f"{SYN_STUDY}/summary.csv",
        f"{SYN_STUDY}/deposit.csv",
        [path for row in STUDY_FIGURES.values() for ext in ("png", "pdf") for path in row.paths({}, ext)],
        rules.reproduction.output,


# The regime study (README "The regime study", docs/method.md section 8.10): brackets toward the paper's training
# budget and task size on a CPU; its verdicts per regime and its figure.
rule regime_study:
    input:
        [f"{SYN_REGIME}/{name}" for name in ("summary.csv", "classifiers.csv", "deposit.csv", "verdicts.md")],
        [path for row in REGIME_FIGURES.values() for ext in ("png", "pdf") for path in row.paths({}, ext)],


# The decisive subset of the deposit study at the authors' size (config.paper.yaml), for GPU nodes.
rule decisive_study:
    input:
        [f"{SYN_DECISIVE}/{name}" for name in ("summary.csv", "classifiers.csv", "deposit.csv", "verdicts.md")],
