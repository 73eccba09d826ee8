# The first paper (docs/method.md sections 1-7): per (model, variant), the extraction of pre-RoPE q/k per shard of
# windows (the fused path also writes the shard's decomposition and band statistics; the store path has rules
# decompose and bands read them back), the gather of the shards, the summaries, the example heads and block swaps,
# the position experiments and per-head ablation, the position study's answer and both papers' reproduction
# tables. Logic in posgen.llm (each step's runner: posgen.workflow.steps).


rule extract:
    input:
        manifest=paths.MANIFEST,
        windows=paths.WINDOWS,
    output:
        **({table: paths.shard_table(table) for table in ("decomposition", "bands")} if FUSED else {}),
        qk=paths.QK,
    log:
        paths.log("extract", "{model}", "{variant}", "{shard}"),
    benchmark:
        paths.benchmark("extract", "{model}", "{variant}", "{shard}")
    priority: MODEL_PRIORITY["extract"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("extract"),
    params:
        **params_of("extract"),
    script:
        "../workflow_scripts/step.py"


# The store path (extract.analysis: store) decomposes each shard's stored q/k in jobs of its own.
if not FUSED:

    rule decompose:
        input:
            qk=paths.QK,
        output:
            decomposition=paths.shard_table("decomposition"),
        log:
            paths.log("decompose", "{model}", "{variant}", "{shard}"),
        benchmark:
            paths.benchmark("decompose", "{model}", "{variant}", "{shard}")
        conda:
            "../envs/posgen.yaml"
        threads: MODEL_THREADS
        resources:
            **resources_for("decompose"),
        params:
            **params_of("decompose"),
        script:
            "../workflow_scripts/step.py"

    rule bands:
        input:
            qk=paths.QK,
        output:
            bands=paths.shard_table("bands"),
        log:
            paths.log("bands", "{model}", "{variant}", "{shard}"),
        benchmark:
            paths.benchmark("bands", "{model}", "{variant}", "{shard}")
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            **resources_for("bands"),
        params:
            **params_of("bands"),
        script:
            "../workflow_scripts/step.py"


localrules:
    gather,
    summary_table,
    gap_origin,
    prefix_table,
    reproduction,
    scale_table,
    confirmatory_table,
    band_study_table,


# The shards' NetCDFs merged along `sample` (bands: averaged, weighted by windows): the unsharded file.
rule gather:
    input:
        shards=gathered_shards,
    output:
        table=paths.TABLE,
    log:
        paths.log("gather", "{model}", "{variant}", "{table}"),
    wildcard_constraints:
        table="|".join(GATHERED),
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/step.py"


# One job per model, so that adding a model leaves the others' summaries (and their figures) alone.
rule summarize:
    input:
        decomposition=over_variants(paths.DECOMPOSITION),
    output:
        **paths.MODEL_SUMMARY,
    log:
        paths.log("summarize", "{model}"),
    benchmark:
        paths.benchmark("summarize", "{model}")
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        **params_of("summarize"),
    script:
        "../workflow_scripts/step.py"


# results/summary.csv: the per-model tables, models in name order; every row keeps its own job's config_hash.
rule summary_table:
    input:
        csv=expand(paths.MODEL_SUMMARY["csv"], model=sorted(MODELS)),
    output:
        csv=paths.SUMMARY_TABLE,
    log:
        paths.log("summary_table"),
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/step.py"


# The example heads' logit maps (figures 1-2) from the kept window's q/k.
rule examples:
    input:
        qk=expand(paths.QK, shard=FIGURE_SHARD, allow_missing=True)[0],
        decomposition=paths.DECOMPOSITION,
    output:
        examples=paths.EXAMPLES,
    log:
        paths.log("figures", "{model}", "{variant}", "examples"),
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        **params_of("examples"),
    script:
        "../workflow_scripts/step.py"


# A second reading per head: block-swap scores of the example window's q/k beside the decomposition's f share
# (posgen.llm.block_swap, docs/method.md section 3D).
rule block_swap:
    input:
        qk=expand(paths.QK, shard=FIGURE_SHARD, allow_missing=True)[0],
        decomposition=paths.DECOMPOSITION,
    output:
        block_swap=paths.variant_table("block_swap"),
    log:
        paths.log("figures", "{model}", "{variant}", "block_swap"),
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        **params_of("block_swap"),
    script:
        "../workflow_scripts/step.py"


# Position-generalisation experiments (docs/method.md section 7): perturbed token order / position ids, and
# LM-Infinite style RoPE distance capping, one job per shard of the perturbation windows.
rule perturb:
    input:
        manifest=paths.MANIFEST,
        windows=paths.WINDOWS,
    output:
        nc=paths.shard_table("perturb"),
    log:
        paths.log("perturb", "{model}", "{variant}", "{shard}"),
    benchmark:
        paths.benchmark("perturb", "{model}", "{variant}", "{shard}")
    priority: MODEL_PRIORITY["perturb"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("perturb"),
    params:
        **params_of("perturb"),
    script:
        "../workflow_scripts/step.py"


rule cap:
    input:
        manifest=paths.MANIFEST,
        windows=paths.WINDOWS,
    output:
        nc=paths.shard_table("cap"),
    log:
        paths.log("cap", "{model}", "{variant}", "{shard}"),
    benchmark:
        paths.benchmark("cap", "{model}", "{variant}", "{shard}")
    priority: MODEL_PRIORITY["cap"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("cap"),
    params:
        **params_of("cap"),
    script:
        "../workflow_scripts/step.py"


# Per-head ablation of the pretrained LLMs (docs/method.md section 8.6), beside each head's Method A numbers. Not
# sharded: its per-layer statistics of means over both probes cannot be gathered along `sample`.
rule head_ablation:
    input:
        manifest=paths.MANIFEST,
        windows=paths.WINDOWS,
        decomposition=paths.DECOMPOSITION,
    output:
        nc=paths.HEAD_ABLATION,
    log:
        paths.log("head_ablation", "{model}", "{variant}"),
    benchmark:
        paths.benchmark("head_ablation", "{model}", "{variant}")
    priority: MODEL_PRIORITY["head_ablation"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("head_ablation"),
    params:
        **params_of("head_ablation"),
    script:
        "../workflow_scripts/step.py"


# Band interventions (issue 65, docs/method.md section 6.4): the model with a share of its RoPE bands stopped or a
# quarter zeroed, against the unmodified model; the heads' low-frequency shares and f shares read beside.
rule band_interventions:
    input:
        manifest=paths.MANIFEST,
        windows=paths.WINDOWS,
        bands=paths.BANDS,
        decomposition=paths.DECOMPOSITION,
    output:
        nc=paths.variant_table("band_interventions"),
    log:
        paths.log("band_interventions", "{model}", "{variant}"),
    benchmark:
        paths.benchmark("band_interventions", "{model}", "{variant}")
    priority: MODEL_PRIORITY["band_interventions"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("band_interventions"),
    params:
        **params_of("band_interventions"),
    script:
        "../workflow_scripts/step.py"


# The position study's answer (README "The position study", docs/method.md section 3C): where Method A's
# random-init gap comes from, per model and random-init seed, from the run's results/summary.csv.
rule gap_origin:
    input:
        csv=paths.SUMMARY_TABLE,
    output:
        md=paths.GAP_ORIGIN,
    log:
        paths.log("gap_origin"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("gap_origin"),
    script:
        "../workflow_scripts/step.py"


# The prefix study (README "The prefix study", docs/method.md section 3E): the geometry of each window's key
# trajectory per window set (a models entry's window_set), and its registered readings.
rule prefix_content:
    input:
        manifest=paths.MANIFEST,
        windows=paths.WINDOWS,
    output:
        nc=paths.variant_table("prefix_content"),
    log:
        paths.log("prefix_content", "{model}", "{variant}"),
    benchmark:
        paths.benchmark("prefix_content", "{model}", "{variant}")
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=6000,
        runtime=60,
    params:
        **params_of("prefix_content"),
    script:
        "../workflow_scripts/step.py"


rule prefix_table:
    input:
        summary=paths.SUMMARY_TABLE,
        contents=every_variant(paths.variant_table("prefix_content"), [v for v in VARIANTS if v != "trained"]),
    output:
        **paths.PREFIX_TABLE,
    log:
        paths.log("prefix_table"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("prefix_table"),
    script:
        "../workflow_scripts/step.py"


# The scale study's table (target `scale_study`): per model against its size, the trends under the registered
# rules (posgen.verdict_rules SCALE_*), every first-paper verdict per model.
rule scale_table:
    input:
        **first_paper_results(),
    output:
        **paths.SCALE_TABLE,
    log:
        paths.log("scale_table"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("scale_table"),
    script:
        "../workflow_scripts/step.py"


# The band-intervention study's table (target `band_study`): reproduction.md's band section, on its own.
rule band_study_table:
    input:
        band_interventions=expand(
            paths.variant_table("band_interventions"),
            model=MODELS,
            variant=step_variants(config, "band_interventions"),
        ),
    output:
        md=paths.BAND_STUDY,
    log:
        paths.log("band_study_table"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("band_study_table"),
    script:
        "../workflow_scripts/step.py"


# Both papers' reproduction tables, with a verdict per claim.
rule reproduction:
    input:
        **section_tables(config),
        summary=paths.SUMMARY_TABLE,
        synthetic_summary=paths.in_collection(paths.COLLECTION_TABLES["csv"], "run"),
        synthetic_classifiers=paths.in_collection(paths.COLLECTION_TABLES["classifiers"], "run"),
        study_summary=study_summary_if_built,
        bands=expand(paths.BANDS, model=MODELS, variant=VARIANTS),
        perturb=expand(paths.PERTURB, model=MODELS, variant=step_variants(config, "perturb")),
        cap=expand(paths.CAP, model=MODELS, variant=step_variants(config, "cap")),
    output:
        csv=report(
            paths.REPRODUCTION["csv"],
            caption="../report/reproduction.rst",
            category="0. Reproduction tables",
            subcategory="all models",
            labels={"table": "reproduction"},
        ),
        md=paths.REPRODUCTION["md"],
        synthetic_csv=report(
            paths.REPRODUCTION["synthetic_csv"],
            caption="../report/reproduction_synthetic.rst",
            category="0. Reproduction tables",
            subcategory="all models",
            labels={"table": "reproduction (second paper)"},
        ),
        verdicts=report(
            paths.REPRODUCTION["verdicts"],
            caption="../report/verdicts.rst",
            category="0. Reproduction tables",
            subcategory="all models",
            labels={"table": "verdicts (both papers)"},
        ),
        verdicts_table=paths.REPRODUCTION["verdicts_table"],
    log:
        paths.log("figures", "reproduction"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("reproduction"),
    script:
        "../workflow_scripts/step.py"


# The confirmatory replication (README "The confirmatory replication"; config.confirm.yaml): every first-paper
# verdict on fresh windows beside its exploratory twin's.
rule confirmatory_table:
    input:
        **first_paper_results(),
    output:
        **paths.CONFIRMATORY_TABLE,
    log:
        paths.log("confirmatory_table"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("confirmatory_table"),
    script:
        "../workflow_scripts/step.py"
