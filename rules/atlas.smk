# The head atlas (issue 55, posgen.atlas): the per-head tables as Parquet and one offline page over both papers.


localrules:
    heads,
    classifier_heads,
    atlas,


# results/heads.parquet: one row per (model, variant, layer, head, method, sink), every per-head statistic with
# its interval over windows; its inputs: decomposition.nc and each step's table that declares per-head columns.
rule heads:
    input:
        **head_tables(config),
    output:
        heads=paths.HEADS,
    log:
        paths.log("atlas", "heads"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("heads"),
    script:
        "../workflow_scripts/step.py"


# A collection's per-classifier, per-head table: each classifier's ablation drops beside its Toeplitz shares.
rule classifier_heads:
    input:
        ablation=paths.COLLECTION_PARTS["ablation"],
        toeplitz=paths.COLLECTION_PARTS["toeplitz"],
    output:
        heads=paths.CLASSIFIER_HEADS,
    log:
        paths.log("atlas", "classifier_heads{collection}"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("classifier_heads"),
    script:
        "../workflow_scripts/step.py"


# results/atlas.html: built from the tables above and the run's NetCDFs; it reads no config leaf of its own, so a
# figure setting reruns it only through a file it reads (figures.map_tokens through examples.nc).
rule atlas:
    input:
        heads=paths.HEADS,
        classifier_heads=paths.in_collection(paths.CLASSIFIER_HEADS, "run"),
        training=paths.in_collection(paths.COLLECTION_PARTS["training"], "run"),
        examples=expand(paths.EXAMPLES, model=MODELS, variant=VARIANTS),
        bands=expand(paths.BANDS, model=MODELS, variant=VARIANTS),
        verdicts=paths.REPRODUCTION["verdicts_table"],
    output:
        atlas=report(
            paths.ATLAS,
            caption="../report/atlas.rst",
            category="0. Head atlas",
            labels={"page": "atlas"},
        ),
    log:
        paths.log("atlas", "atlas"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("atlas"),
    script:
        "../workflow_scripts/step.py"
