# Resources that follow the model (docs/slurm.md, "Planning a run"): host memory, runtime, GPU memory and disk
# of the heavy rules from the model's shape (its config.json beside the manifest) and the job's shard of windows,
# by posgen.plan's cost model; memory and runtime grow by 1.5x per retry after a failure (out of memory, time
# limit). Included by the Snakefile before the rules that use it:
#     resources:
#         **resources_for("extract"),
from posgen.plan import resource_names, rule_resources  # noqa: E402


def _job_resources(rule, wildcards, input, attempt):
    manifest = input.get("manifest") if hasattr(input, "get") else None
    model_dir = Path(manifest).parent if manifest else Path(paths.MODELS_DIR) / wildcards.model
    shard = getattr(wildcards, "shard", None)
    entry = model_entry(config, wildcards.model)
    return rule_resources(rule, model_dir, entry, wildcards.variant, shard, config, attempt)


def resources_for(rule):
    """{resource: callable(wildcards, input, attempt)} for the model-job ``rule`` (posgen.workflow.MODEL_JOB_RULES);
    ``gpu`` only where the rule runs on a GPU."""

    def one(name):
        def resource(wildcards, input, attempt):
            return _job_resources(rule, wildcards, input, attempt).get(name, 0)

        return resource

    return {name: one(name) for name in resource_names(rule)}
