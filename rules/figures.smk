# Paper figures (PNG for the report, PDF for the paper) and the reproduction table, one rule each.
# The drawing functions and input loaders live in posgen.figures (FIGURES, same names as here).

FIGURE_OPTIONS = config["figures"]
# figure name -> report category; the number fixes the order in the report's menu
FIGURE_CATEGORIES = {
    "logit_maps": "1. Logit maps",
    "scatter": "2. W against f + g",
    "r_heatmap": "3. r over layer x head",
    "layer_r": "4. Per-layer r",
    "bands": "5. Feature bands",
    "dummy_sweep": "6. Dummy-distance sweep",
    "perturb_ppl": "7. Perturbation: perplexity",
    "perturb_fg": "8. Perturbation: f and g change",
    "cap": "9. Distance capping",
}


localrules:
    fig_logit_maps,
    fig_scatter,
    fig_r_heatmap,
    fig_layer_r,
    fig_bands,
    fig_dummy_sweep,
    fig_perturb_ppl,
    fig_perturb_fg,
    fig_cap,
    reproduction,


rule example_heads:
    input:
        qk="results/{model}/{variant}/qk.h5",
        decomposition="results/{model}/{variant}/decomposition.nc",
    output:
        examples="results/{model}/{variant}/examples.nc",
    log:
        "logs/figures/{model}/{variant}/example_heads.log",
    params:
        options=FIGURE_OPTIONS,
        config_hash=CONFIG_HASH,
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure_examples.py"


rule fig_logit_maps:
    input:
        examples=rules.example_heads.output.examples,
    output:
        png=report(
            "results/{model}/figures/logit_maps_{variant}.png",
            caption="../report/logit_maps.rst",
            category=FIGURE_CATEGORIES["logit_maps"],
            subcategory="{model}",
            labels={"figure": "logit_maps", "variant": "{variant}"},
        ),
        pdf="results/{model}/figures/logit_maps_{variant}.pdf",
    log:
        "logs/figures/{model}/logit_maps_{variant}.log",
    params:
        figure="logit_maps",
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_scatter:
    input:
        examples=rules.example_heads.output.examples,
    output:
        png=report(
            "results/{model}/figures/scatter_{variant}.png",
            caption="../report/scatter.rst",
            category=FIGURE_CATEGORIES["scatter"],
            subcategory="{model}",
            labels={"figure": "scatter", "variant": "{variant}"},
        ),
        pdf="results/{model}/figures/scatter_{variant}.pdf",
    log:
        "logs/figures/{model}/scatter_{variant}.log",
    params:
        figure="scatter",
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


# Inputs given per variant come in VARIANTS order; params.variants names them in that order.
rule fig_r_heatmap:
    input:
        decomposition=expand("results/{{model}}/{variant}/decomposition.nc", variant=VARIANTS),
    output:
        png=report(
            "results/{model}/figures/r_heatmap.png",
            caption="../report/r_heatmap.rst",
            category=FIGURE_CATEGORIES["r_heatmap"],
            subcategory="{model}",
            labels={"figure": "r_heatmap"},
        ),
        pdf="results/{model}/figures/r_heatmap.pdf",
    log:
        "logs/figures/{model}/r_heatmap.log",
    params:
        figure="r_heatmap",
        variants=VARIANTS,
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_layer_r:
    input:
        summary="results/{model}/summary.nc",
    output:
        png=report(
            "results/{model}/figures/layer_r.png",
            caption="../report/layer_r.rst",
            category=FIGURE_CATEGORIES["layer_r"],
            subcategory="{model}",
            labels={"figure": "layer_r"},
        ),
        pdf="results/{model}/figures/layer_r.pdf",
    log:
        "logs/figures/{model}/layer_r.log",
    params:
        figure="layer_r",
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_bands:
    input:
        bands=expand("results/{{model}}/{variant}/bands.nc", variant=VARIANTS),
    output:
        png=report(
            "results/{model}/figures/bands.png",
            caption="../report/bands.rst",
            category=FIGURE_CATEGORIES["bands"],
            subcategory="{model}",
            labels={"figure": "bands"},
        ),
        pdf="results/{model}/figures/bands.pdf",
    log:
        "logs/figures/{model}/bands.log",
    params:
        figure="bands",
        variants=VARIANTS,
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_dummy_sweep:
    input:
        decomposition=expand("results/{{model}}/{variant}/decomposition.nc", variant=VARIANTS),
    output:
        png=report(
            "results/{model}/figures/dummy_sweep.png",
            caption="../report/dummy_sweep.rst",
            category=FIGURE_CATEGORIES["dummy_sweep"],
            subcategory="{model}",
            labels={"figure": "dummy_sweep"},
        ),
        pdf="results/{model}/figures/dummy_sweep.pdf",
    log:
        "logs/figures/{model}/dummy_sweep.log",
    params:
        figure="dummy_sweep",
        variants=VARIANTS,
        n_boot=config["decomposition"]["bootstrap"],
        seed=config["decomposition"]["bootstrap_seed"],
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_perturb_ppl:
    input:
        perturb=expand("results/{{model}}/{variant}/perturb.nc", variant=VARIANTS),
    output:
        png=report(
            "results/{model}/figures/perturb_ppl.png",
            caption="../report/perturb_ppl.rst",
            category=FIGURE_CATEGORIES["perturb_ppl"],
            subcategory="{model}",
            labels={"figure": "perturb_ppl"},
        ),
        pdf="results/{model}/figures/perturb_ppl.pdf",
    log:
        "logs/figures/{model}/perturb_ppl.log",
    params:
        figure="perturb_ppl",
        variants=VARIANTS,
        n_boot=config["decomposition"]["bootstrap"],
        seed=config["decomposition"]["bootstrap_seed"],
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_perturb_fg:
    input:
        perturb=expand("results/{{model}}/{variant}/perturb.nc", variant=VARIANTS),
    output:
        png=report(
            "results/{model}/figures/perturb_fg.png",
            caption="../report/perturb_fg.rst",
            category=FIGURE_CATEGORIES["perturb_fg"],
            subcategory="{model}",
            labels={"figure": "perturb_fg"},
        ),
        pdf="results/{model}/figures/perturb_fg.pdf",
    log:
        "logs/figures/{model}/perturb_fg.log",
    params:
        figure="perturb_fg",
        variants=VARIANTS,
        n_boot=config["decomposition"]["bootstrap"],
        seed=config["decomposition"]["bootstrap_seed"],
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule fig_cap:
    input:
        cap=expand("results/{{model}}/{variant}/cap.nc", variant=VARIANTS),
    output:
        png=report(
            "results/{model}/figures/cap.png",
            caption="../report/cap.rst",
            category=FIGURE_CATEGORIES["cap"],
            subcategory="{model}",
            labels={"figure": "cap"},
        ),
        pdf="results/{model}/figures/cap.pdf",
    log:
        "logs/figures/{model}/cap.log",
    params:
        figure="cap",
        variants=VARIANTS,
        n_boot=config["decomposition"]["bootstrap"],
        seed=config["decomposition"]["bootstrap_seed"],
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/figure.py"


rule reproduction:
    input:
        summary="results/summary.csv",
    output:
        csv=report(
            "results/reproduction.csv",
            caption="../report/reproduction.rst",
            category="0. Reproduction of r = 0.959",
            subcategory="all models",
            labels={"table": "reproduction"},
        ),
        md="results/reproduction.md",
    log:
        "logs/figures/reproduction.log",
    params:
        config_hash=CONFIG_HASH,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/reproduction.py"


TARGETS.extend(
    expand(
        "results/{model}/figures/{name}_{variant}.{ext}",
        model=MODELS,
        name=["logit_maps", "scatter"],
        variant=VARIANTS,
        ext=["png", "pdf"],
    )
)
TARGETS.extend(
    expand(
        "results/{model}/figures/{name}.{ext}",
        model=MODELS,
        name=[n for n in FIGURE_CATEGORIES if n not in ("logit_maps", "scatter")],
        ext=["png", "pdf"],
    )
)
TARGETS.extend(rules.reproduction.output)
