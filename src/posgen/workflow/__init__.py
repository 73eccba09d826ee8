"""The workflow's declarations, read by the Snakefile, rules/*.smk, the workflow scripts and posgen.plan: every step
of both papers with the config leaves it reads and its runner (``steps``), the figure table (``figures``), the
second paper's jobs (``synthetic``), the shards (``sharding``), what each target builds (``targets``) and the job a
runner is handed (``job``). Their path templates are posgen.paths, on the ground floor.

Light on purpose: the Snakefile imports it while parsing, in an environment that may hold snakemake alone (no
torch, transformers, xarray, h5py, h5netcdf; tests/workflow/test_workflow.py checks it).
"""
