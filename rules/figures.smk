# Paper figures (PNG for the report, PDF for the paper), one `fig_<name>` rule per row of the figure table
# (posgen.figure_table: category, caption, inputs, scope, bootstrap), and the reproduction table.
# posgen.figures.registry maps the same names to their loaders and drawing functions.


rule examples:
    input:
        qk=expand(rules.extract.output.qk, shard=FIGURE_SHARD, allow_missing=True)[0],
        decomposition=DECOMPOSITION,
    output:
        examples=EXAMPLES,
    log:
        "logs/figures/{model}/{variant}/examples.log",
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        **params_of("examples"),
    script:
        "../workflow_scripts/examples.py"


# A second reading per head: block-swap scores of the example window's q/k beside the decomposition's f share
# (posgen.llm.block_swap, docs/method.md section 3D).
rule block_swap:
    input:
        qk=expand(rules.extract.output.qk, shard=FIGURE_SHARD, allow_missing=True)[0],
        decomposition=DECOMPOSITION,
    output:
        block_swap=BLOCK_SWAP,
    log:
        "logs/figures/{model}/{variant}/block_swap.log",
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        **params_of("block_swap"),
    script:
        "../workflow_scripts/block_swap.py"


# Inputs expanded over variants come in VARIANTS order; params.variants names them in that order.
for row in FIGURE_TABLE.values():

    rule:
        name:
            f"fig_{row.name}"
        input:
            **figure_inputs(row),
        output:
            png=report(
                row.output("png"),
                caption=f"../{row.caption}",
                category=row.category,
                subcategory="{model}" if "model" in row.wildcards else "all models",
                labels={"figure": row.name, **({"variant": "{variant}"} if "variant" in row.wildcards else {})},
            ),
            pdf=row.output("pdf"),
        log:
            row.log,
        localrule: True
        conda:
            "../envs/posgen.yaml"
        params:
            figure=row.name,
            variants=figure_wildcards(config, row)["variant"] if "variant" in row.expanded() else [],
            n_boot=config["intervals"]["bootstrap"] if row.bootstrap else None,
            seed=config["intervals"]["seed"] if row.bootstrap else None,
            config_hash=figure_hash(row),
        script:
            "../workflow_scripts/figure.py"


localrules:
    reproduction,


rule reproduction:
    input:
        summary=rules.summary_table.output.csv,
        synthetic_summary="results/synthetic/summary.csv",
        synthetic_classifiers="results/synthetic/classifiers.csv",
        study_summary=study_summary_if_built,
        bands=expand(BANDS, model=MODELS, variant=VARIANTS),
        perturb=expand(PERTURB, model=MODELS, variant=step_variants(config, "perturb")),
        cap=expand(CAP, model=MODELS, variant=step_variants(config, "cap")),
        block_swap=expand(BLOCK_SWAP, model=MODELS, variant=VARIANTS),
    output:
        csv=report(
            REPRODUCTION["csv"],
            caption="../report/reproduction.rst",
            category="0. Reproduction tables",
            subcategory="all models",
            labels={"table": "reproduction"},
        ),
        md=REPRODUCTION["md"],
        synthetic_csv=report(
            REPRODUCTION["synthetic_csv"],
            caption="../report/reproduction_synthetic.rst",
            category="0. Reproduction tables",
            subcategory="all models",
            labels={"table": "reproduction (second paper)"},
        ),
    log:
        "logs/figures/reproduction.log",
    conda:
        "../envs/posgen.yaml"
    params:
        config_hash=hash_of([], per_model=False),
    script:
        "../workflow_scripts/reproduction.py"
