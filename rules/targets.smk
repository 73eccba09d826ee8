# The named targets (README): each builds what posgen.workflow.targets lists for it. Rule `all` (the Snakefile)
# builds none of them.
localrules:
    position_study,
    prefix_study,
    trajectory,
    deposit_study,
    regime_study,
    decisive_study,
    decisive_gpu,
    scale_study,
    band_study,
    confirmatory,


# The position study's answer (README "The position study"), from the run's summary.
rule position_study:
    input:
        targets(config, "position_study"),


# Prefix content or position? (README "The prefix study"): the window sets of config.prefix.yaml.
rule prefix_study:
    input:
        targets(config, "prefix_study"),


# The checkpoint series of config `trajectory.models`: per-step tables and figures.
rule trajectory:
    input:
        targets(config, "trajectory"),


# The deposit study (README "The deposit study", docs/method.md section 8.8): also rewrites results/reproduction.md
# with a verdict per claim from the study.
rule deposit_study:
    input:
        targets(config, "deposit_study"),


# The regime study (README "The regime study", docs/method.md section 8.10): brackets toward the paper's training
# budget and task size on a CPU; its verdicts per regime and its figure.
rule regime_study:
    input:
        targets(config, "regime_study"),


# The decisive subset of the deposit study at the authors' size (config.paper.yaml), for GPU nodes.
rule decisive_study:
    input:
        targets(config, "decisive_study"),


# The regime study's distance-71 arms with enough data per class, for one GPU call (README "The decisive GPU
# experiment"; its verdict rules were registered before it ran: python -m posgen.verdict_rules).
rule decisive_gpu:
    input:
        targets(config, "decisive_gpu"),


# The scale study (README "The scale study"): config.scale.yaml's four models, trained and random-init, their
# trends with size under the rules registered before it ran (posgen.verdict_rules SCALE_*), its table and figure.
rule scale_study:
    input:
        targets(config, "scale_study"),


# The band-intervention study (README "The band-intervention study", docs/method.md section 6.4): config.bands.yaml's
# models at the full grid, trained and random-init, under the predictions registered before the step existed
# (posgen.verdict_rules BAND_*): its table and the band_loss figures, without the rest of reproduction.md.
rule band_study:
    input:
        targets(config, "band_study"),


# The confirmatory replication (README "The confirmatory replication"): config.confirm.yaml's fresh windows beside
# their exploratory twin, every first-paper verdict under the frozen registry, and every outcome that differs.
rule confirmatory:
    input:
        targets(config, "confirmatory"),
