# Paper figures (PNG for the report, PDF for the paper): one rule per scope, the figure a wildcard whose row in
# posgen.workflow.figures names its inputs, its target, its loader and drawing function; its caption is its section
# of report/figures.rst. Inputs expanded over variants come in the workflow's order; params.variants names them.


localrules:
    fig_per_variant,
    fig_per_model,
    fig_global,


rule fig_per_variant:
    input:
        unpack(lambda wildcards: figure_inputs(config, wildcards)),
    output:
        **figure_output("per_variant"),
    log:
        paths.FIGURE_LOGS["per_variant"],
    wildcard_constraints:
        figure=alternatives(of_scope("per_variant")),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("figure"),
    script:
        "../workflow_scripts/step.py"


use rule fig_per_variant as fig_per_model with:
    output:
        **figure_output("per_model"),
    log:
        paths.FIGURE_LOGS["per_model"],
    wildcard_constraints:
        figure=alternatives(of_scope("per_model")),


use rule fig_per_variant as fig_global with:
    output:
        **figure_output("global"),
    log:
        paths.FIGURE_LOGS["global"],
    wildcard_constraints:
        figure=alternatives(of_scope("global")),
