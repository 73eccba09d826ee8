# Paper figures (PNG for the report, PDF for the paper): one `fig_<name>` rule per row of the figure table
# (posgen.workflow.figures: inputs, scope, the target that builds it, its loader and drawing function).
# Inputs expanded over variants come in the workflow's order; params.variants names them in that order.
for row in FIGURES.values():

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
                subcategory=row.subcategory,
                labels=row.labels,
            ),
            pdf=row.output("pdf"),
        log:
            row.log,
        localrule: True
        conda:
            "../envs/posgen.yaml"
        params:
            **params_of("figure", row=row),
        script:
            "../workflow_scripts/step.py"
