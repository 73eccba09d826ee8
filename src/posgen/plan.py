"""What a run will cost before anything is submitted: per job, the device memory, host memory, disk written and
time, from each model's shape and the config (docs/slurm.md, "Planning a run").

    python -m posgen.plan --configfile config.paper.yaml [--device gpu|cpu] [--study decisive_study]

The same model sizes the SLURM jobs (``job_resources``, read by ``rules/resources.smk``).

Cost model (symbols: T tokens per window, L layers, H query heads, H_kv key heads, d head_dim, P_body the
non-embedding parameters, nD dummy distances of the sweep plus the headline one, n_z = 2 T + n_delta the unknowns
of Method B, n_delta = T or the sliding window):

* forward pass of one window: ``2 P_body T + 2 L H d T^2`` FLOPs (projections and MLPs, plus causal QK^T and AV).
  Extraction runs it through the capturing backend, which also copies q/k off the layer: ``CAPTURE_OVERHEAD``.
* decomposition of one (window, layer) (``masked_moments`` and Method B):
  moments ``(26 H + 2 H_kv) T d^2 + 2 H T C d (3 + nD) + 2 H T C (3 + nD)^2`` (C = 32 ragged key columns, 96 for a
  sliding window), Method B its FFTs ``10 (H + H_kv) d 2T log2(2T)`` and the bytes of its conjugate gradients
  (matrix-free, ``CG_STEPS`` steps per sink of ``CG_PASSES`` passes over ``H n_z`` float64 values).
* error of A and section 5 bound on the ``bound_samples`` windows, float32, per (window, layer):
  ``(4 d + 3 d / 2 + 8) H T^2`` (two sinks, T^2 / 2 entries each; 8 elementwise operations per entry).
* feature bands: a few passes over q/k (negligible next to the above).
* head ablation, per sequence: one forward, ``H L (L + 1) / 2`` layer passes and the LM head at the scored targets.
* band interventions, per (window, setting), S = 1 + 2 shares (+ 4 quarters zeroed) settings: one forward with the
  LM head through eager attention (the capturing forward plus ``EAGER_PASSES`` over its float32 probabilities
  ``4 L H T^2``, both sets of which stay on the device), the decomposition without the error pass, and the per-head
  KL on the host (``KL_BYTES`` per probability at the CPU's memory rate, in a GPU job too).
* bytes: q/k of a kept window ``L (H + H_kv) T d b`` with b the bytes of ``extract.qk_dtype``, reference logits
  ``H T^2 4`` per (reference window, reference layer), decomposition.nc ``(44 + 2 nD) 8`` bytes per
  (window, layer, head), bands.nc ``6 (H + H_kv) d / 2 8`` bytes per (window, layer).
* time = each part's FLOPs over the device's sustained rate for that kind of work (:class:`Rates`: forward
  pass, moments, FFTs, memory streaming, float32 error pass, disk bytes) plus a start-up per job (interpreter,
  imports, reading the weights).
* memory: device = weights in ``dtype`` + one window's activations + the analysis working set of one layer
  (the moments' query Grams ``4 H T d^2 / 32 8``, Method B's vectors, the error pass's row blocks: all linear in
  T); host = the weights while they load (on a GPU job), one window's float32 q/k, the
  reference logits, and on a CPU job everything the device would hold.

``CPU`` rates (:mod:`posgen.rates`) are calibrated on this project's 2-core machine (``python -m posgen.bench scale``, which prints
predicted against measured per stage); ``GPU`` rates are ASSUMPTIONS for one H100 until measured there: a
committed device check (``docs/gpu/gpu-report.json``, ``python -m posgen.bench gpu``) replaces the forward,
moments and error rates it measured, and the printed plan names which rates are measured and which assumed.
Shapes come from the acquired ``resources/models/<name>/config.json`` when present, else from the recorded shapes
of :mod:`posgen.shapes` (by name or hub id); a model with neither is listed as unknown. The shape and the
per-part arithmetic (FLOPs, bytes, the decomposition's seconds) are :mod:`posgen.plan_model`'s.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path

from posgen.config import schema_default, schema_defaults
from posgen.llm.band_settings import grid
from posgen.numerics import DENSE_TOKENS, SMOOTH_DEGREE, TOKEN_BLOCK
from posgen.paths import MODELS_DIR
from posgen.plan_model import (
    CAPTURE_OVERHEAD,
    DTYPE_BYTES,
    Shape,
    analysis_seconds,
    forward_flops,
    model_shape,
    model_shape_at,
)
from posgen.rates import CPU, Rates, committed_rates
from posgen.workflow.sharding import parse_shard, rule_shards, rule_windows
from posgen.workflow.steps import GPU_RULES, MODEL_JOB_RULES, planned_rules, step_variants

RETRY_GROWTH = 1.5  # memory and runtime asked for on attempt a: (RETRY_GROWTH ** (a - 1)) x the estimate
MEM_MARGIN = 1.25  # safety margin on every memory ask
MIN_MEM_MB = 2000
MIN_RUNTIME_MIN = 10
# posgen.llm.band_interventions: eager attention's passes over a layer's float32 probabilities beyond a capturing
# (SDPA) pass (scores, mask, softmax, the kept copy; 3.7 measured, SmolLM2 4 layers x 512 tokens, 1 thread), and the
# host bytes per probability of the per-head KL and changes (_head_changes, float64: 44 ns per probability measured
# on the 2-core machine, 1 thread, load 4, i.e. 88 bytes at posgen.rates.CPU's memory rate)
EAGER_PASSES = 4
KL_BYTES = 88


# --------------------------------------------------------------------------------------------- the jobs


@dataclass(frozen=True)
class Cost:
    """One job's expected figures."""

    rule: str
    device_gb: float  # device memory (0 for a CPU-only rule)
    host_gb: float
    disk_gb: float
    seconds: float
    refs_gb: float = 0.0  # of disk_gb: the reference logits of the self-check


def config_options(cfg: dict) -> dict:
    """The scale options of docs/slurm.md; a key absent from ``cfg`` (an older config, one not validated) takes
    the schema's default."""
    extract = {**schema_defaults("extract"), **cfg.get("extract", {})}
    keep, analysis, qk_dtype = extract["keep_qk"], extract["analysis"], extract["qk_dtype"]
    if analysis not in ("fused", "store"):
        raise ValueError(f"extract.analysis: {analysis!r} (fused | store)")
    if qk_dtype not in DTYPE_BYTES:
        raise ValueError(f"extract.qk_dtype: {qk_dtype!r} ({' | '.join(DTYPE_BYTES)})")
    if analysis == "store" or keep == "all":
        keep = cfg["n_samples"]
    return {
        "shards": int(cfg.get("shards", schema_default("shards"))),
        "analysis": analysis,
        "keep_qk": int(keep),
        "qk_dtype": qk_dtype,
        "ref_samples": list(extract["ref_samples"]),
        "ref_layers": list(extract["ref_layers"]),
    }


def _weights_bytes(shape: Shape, dtype: str) -> int:
    return shape.n_params * DTYPE_BYTES[dtype]


def _activation_bytes(shape: Shape, n_tokens: int, dtype: str, n_windows: int = 1) -> int:
    """Hidden and MLP states of the forward pass (a few live at once) and, where the model soft-caps, the
    eager attention matrix of one layer."""
    b = DTYPE_BYTES[dtype]
    states = n_windows * n_tokens * (6 * shape.hidden + 3 * shape.intermediate) * b
    if shape.softcap:
        states += n_windows * 3 * shape.logits_bytes(n_tokens)
    return states


def _analysis_memory(shape: Shape, n_tokens: int, device: str, bound: bool = True) -> int:
    """Working set of one layer's analysis: the moments' Grams, Method B's vectors, the error blocks (``bound``: a
    job with the error pass). On a GPU the device layout (posgen.decomposition.Decomposer ``batched``): every KV
    head's Grams at once, and up to DENSE_TOKENS Method B's factorised normal matrices (two sinks, kept for the job)
    and their construction."""
    T, H, d = n_tokens, shape.n_heads, shape.head_dim
    method_b = 12 * H * 3 * T * 8  # the conjugate gradients' vectors and the FFT sums
    h = H // shape.n_kv_heads
    grams = 3 * (T // TOKEN_BLOCK + 1) * h * (2 * d) ** 2 * 8  # one KV head's query Grams and sums
    if device == "gpu":
        grams *= shape.n_kv_heads
        if T <= DENSE_TOKENS:
            method_b += (2 + 2) * (2 * T) ** 2 * 8  # two inverses, and a build's reduced matrix and mask blocks
    operands = (H + shape.n_kv_heads) * T * d * 8 * 8  # rotated q/k, keys [x | f | phi | g] in float64
    block = 2**28 if device == "gpu" else 2**20
    return method_b + grams + operands + (8 * block * 4 if bound else 0)


def job_cost(rule: str, shape: Shape, cfg: dict, samples: tuple[int, int], device: str = "gpu") -> Cost:
    """Expected figures of one ``rule`` job over the windows ``samples = (start, stop)`` (perturb and cap: over
    their own ``perturb.n_samples`` windows)."""
    opts = config_options(cfg)
    rates = committed_rates(device)[0]
    start, stop = samples
    n = stop - start
    T = cfg["seq_len"]
    dtype = cfg["dtype"] if device == "gpu" else "float32"
    weights = _weights_bytes(shape, dtype)
    dec = cfg["decomposition"]
    bound = dec["bound_samples"] or cfg["n_samples"]
    n_bound = max(0, min(stop, bound) - start)
    n_ref_layers = len(opts["ref_layers"])
    # windows whose reference logits are held for the self-check: the reference windows and the shard's first
    refs = [s for s in sorted(set(opts["ref_samples"]) | {start}) if start <= s < stop]
    analysis_mem = _analysis_memory(shape, T, device)
    qk_window = shape.qk_bytes(T)  # float32 as captured
    n_results = (44 + 2 * len(dec["dummy_distances"])) * 8 * shape.n_layers * shape.n_heads
    n_results += 6 * (shape.n_heads + shape.n_kv_heads) * shape.head_dim // 2 * 8 * shape.n_layers
    forward_s = n * CAPTURE_OVERHEAD * forward_flops(shape, T) / rates.forward
    load_s = rates.start_s + weights / rates.disk
    on_gpu = device == "gpu" and rule in GPU_RULES

    if rule == "extract":
        fused = opts["analysis"] == "fused"
        kept = range(start, min(stop, opts["keep_qk"])) if fused else range(start, stop)
        qk_disk = len(kept) * shape.qk_bytes(T, opts["qk_dtype"])
        # the fused path checks them in memory; the store path keeps the reference windows' (posgen.llm.extract)
        stored_refs = [] if fused else [s for s in opts["ref_samples"] if s in kept]
        ref_disk = len(stored_refs) * n_ref_layers * shape.logits_bytes(T)
        # Method A-shared's held-out windows: one more pass each per job, their mean key summed on the host
        # (float64) and its coefficients on the smooth basis stored (float64)
        heldout = cfg.get("heldout_windows", 0)
        heldout_bytes = shape.n_layers * shape.n_kv_heads * T * shape.head_dim * 4 if heldout else 0
        coef_bytes = shape.n_layers * shape.n_kv_heads * (SMOOTH_DEGREE + 1) * shape.head_dim * 8 if heldout else 0
        disk = qk_disk + ref_disk + (n * n_results if fused else 0) + coef_bytes
        heldout_s = heldout * CAPTURE_OVERHEAD * forward_flops(shape, T) / rates.forward
        seconds = load_s + forward_s + heldout_s + disk / rates.disk
        activations = _activation_bytes(shape, T, dtype) + qk_window + shape.logits_bytes(T) * n_ref_layers
        device_bytes = weights + activations + (analysis_mem if fused else 0)
        if fused:
            seconds += analysis_seconds(shape, cfg, n, n_bound, rates)
        host = qk_window + (n_ref_layers * shape.logits_bytes(T) if refs else 0) + 3 * heldout_bytes
        if on_gpu:
            host += weights  # loaded on the host first
        else:
            host += device_bytes
        cost = _cost(rule, device_bytes if on_gpu else 0, host, disk, seconds)
        return replace(cost, refs_gb=ref_disk / 1e9)
    if rule == "decompose":
        read_s = n * qk_window / rates.disk
        seconds = rates.start_s + read_s + analysis_seconds(shape, cfg, n, n_bound, rates, bands=False)
        device_bytes = analysis_mem + qk_window // shape.n_layers
        host = qk_window // shape.n_layers * 2 + (0 if on_gpu else device_bytes)
        return _cost(rule, device_bytes if on_gpu else 0, host, n * n_results, seconds)
    if rule == "bands":
        seconds = rates.start_s + n * qk_window / rates.disk + n * 8 * shape.qk_bytes(T) / 4 / rates.error
        return _cost(rule, 0, 2 * qk_window // shape.n_layers, n * n_results / 10, seconds)
    if rule in ("perturb", "cap"):
        return _perturb_cost(rule, shape, cfg["perturb"], n, dtype, rates, load_s, weights, on_gpu)
    if rule == "head_ablation":
        return _head_ablation_cost(shape, cfg["head_ablation"], n, dtype, rates, load_s, weights, on_gpu)
    if rule == "band_interventions":
        return _band_cost(shape, cfg, n, dtype, rates, load_s, weights, device)
    raise ValueError(f"rule {rule!r}: the plan knows {', '.join(MODEL_JOB_RULES)}")


def _perturb_cost(
    rule: str, shape: Shape, opts: dict, n: int, dtype: str, rates: Rates, load_s: float, weights: int, on_gpu: bool
) -> Cost:
    """posgen.llm.perturb (``rule`` perturb: the clean pass and one per perturbation kind at every rate above 0)
    or its cap study (``rule`` cap: the clean pass and one per cap) over ``n`` windows of the ``perturb`` section's
    ``seq_len`` tokens."""
    Tp = opts["seq_len"]
    if rule == "perturb":
        passes = 1 + 6 * sum(1 for r in opts["rates"] if r > 0)  # six perturbation kinds (posgen.llm.draws.KINDS)
    else:
        passes = 1 + len(opts["caps"])
    # every pass: the full model (lm_head included) and Method A's f and g of every layer (two T x T
    # products per head), then their change: the matched pairs gathered and correlated, about 8 passes
    # over the (layer, head, T, T) float32 terms per window (1.1 s per pass of 4 x 256 tokens on SmolLM2)
    lm_head = 2 * shape.vocab * shape.hidden * Tp
    terms = 4 * shape.n_layers * shape.n_heads * Tp * Tp * shape.head_dim
    terms_traffic = 8 * shape.n_layers * shape.logits_bytes(Tp)
    seconds = load_s + passes * n * (
        (forward_flops(shape, Tp) + lm_head + terms) / rates.forward + terms_traffic / rates.memory
    )
    fg = 4 * n * shape.n_layers * shape.logits_bytes(Tp)  # f and g of the reference and of one pass
    logits = n * Tp * shape.vocab * 4
    device_bytes = weights + _activation_bytes(shape, Tp, dtype, n) + fg + logits
    host = (weights if on_gpu else device_bytes) + n * shape.qk_bytes(Tp) * 2
    disk = passes * n * (shape.n_layers * 16 + 2 * Tp * 8)
    return _cost(rule, device_bytes if on_gpu else 0, host, disk, seconds)


def _head_ablation_cost(
    shape: Shape, opts: dict, n: int, dtype: str, rates: Rates, load_s: float, weights: int, on_gpu: bool
) -> Cost:
    """posgen.llm.head_ablation over ``n`` corpus windows and the repeat probe (those of ``probes``): per sequence
    of T tokens one clean forward, H ablated copies through layers l..L-1 for every layer l (``H L (L + 1) / 2``
    layer passes) and the LM head at the scored targets of each copy (measured 84-112 s per job of 4 x 32 tokens
    for SmolLM2 on the 2-core machine, docs/results.md; this predicts 75)."""
    L, H = shape.n_layers, shape.n_heads
    period = opts["probe_period"]
    # (tokens, scored targets): the windows' prefixes, then the probe (BOS and two copies; its second copy less one)
    sequences = [(opts["seq_len"], opts["seq_len"] - 1)] * n * ("windows" in opts["probes"])
    sequences += [(2 * period + 1, period - 1)] * opts["probe_samples"] * ("repeat" in opts["probes"])
    lm_head = 2 * shape.vocab * shape.hidden  # FLOPs per scored position
    flops = 0.0
    for tokens, targets in sequences:
        forward = forward_flops(shape, tokens)
        flops += forward + H * L * (L + 1) / 2 * forward / L + (1 + H * L) * targets * lm_head
    longest = max(tokens for tokens, _ in sequences)
    # every layer's cached input, the H ablated copies' activations and their logits at the targets
    cached = L * longest * shape.hidden * DTYPE_BYTES[dtype]
    device_bytes = weights + cached + _activation_bytes(shape, longest, dtype, H) + H * longest * shape.vocab * 4
    host = weights if on_gpu else device_bytes
    n_rows = max(n, opts["probe_samples"])
    disk = 2 * n_rows * L * H * 8 + 12 * L * H * 8  # per-sample losses of both probes, per-head tables
    return _cost("head_ablation", device_bytes if on_gpu else 0, host, disk, load_s + flops / rates.forward)


def _band_cost(
    shape: Shape, cfg: dict, n: int, dtype: str, rates: Rates, load_s: float, weights: int, device: str
) -> Cost:
    """posgen.llm.band_interventions over ``n`` windows of the ``band_interventions`` section's ``seq_len`` tokens,
    one window at a time, after one capturing pass that reads the RoPE table: per window and setting
    (:func:`posgen.llm.band_settings.grid`) a forward pass with the LM head through the band backend's eager attention, which keeps
    every layer's float32 attention probabilities on the device (the unmodified pass's and this one's), the
    decomposition of its q/k (no error bound, no bands table), and the per-head KL and changes on the host."""
    opts = {**schema_defaults("band_interventions"), **cfg.get("band_interventions", {})}
    T, S = opts["seq_len"], len(grid(opts["shares"], opts["ablate"]))
    on_gpu = device == "gpu"
    probs = shape.n_layers * shape.logits_bytes(T)  # one pass's probabilities, every layer
    forward_s = (CAPTURE_OVERHEAD * forward_flops(shape, T) + 2 * shape.vocab * shape.hidden * T) / rates.forward
    analysis_s = analysis_seconds(shape, {**cfg, "seq_len": T}, 1, 0, rates, bands=False)
    kl_s = KL_BYTES * probs / 4 / CPU.memory  # on the host, whatever the device
    seconds = load_s + forward_s + n * S * (forward_s + EAGER_PASSES * probs / rates.memory + analysis_s + kl_s)
    # one window: its activations, one layer's eager scores and probabilities (a soft-capped model's are counted in
    # _activation_bytes), the logits in dtype and float32, its q/k, then the two sets of probabilities
    eager = 0 if shape.softcap else 3 * shape.logits_bytes(T)
    window = _activation_bytes(shape, T, dtype) + eager + T * shape.vocab * (DTYPE_BYTES[dtype] + 4) + shape.qk_bytes(T)
    device_bytes = weights + window + 2 * probs + _analysis_memory(shape, T, device, bound=False)
    # the host also holds one layer's float64 rows of both sets with their logs and products (the KL), and the last
    # layer's logits that the self-check rebuilds from the captured q/k
    kl_work = 6 * 2 * shape.logits_bytes(T) + shape.logits_bytes(T)
    host = (weights + 2 * probs + shape.qk_bytes(T) if on_gpu else device_bytes) + kl_work
    L, H = shape.n_layers, shape.n_heads
    # loss and its change (setting, sample); kl, prev_change, diag_change and Method A's three readings (setting,
    # sample, layer, head); the two head readings (layer, head) and the RoPE table (layer, band), float64
    disk = 8 * (2 * S * n + 6 * S * n * L * H + 2 * L * H + L * shape.head_dim // 2)
    return _cost("band_interventions", device_bytes if on_gpu else 0, host, disk, seconds)


def _cost(rule: str, device_bytes: float, host_bytes: float, disk_bytes: float, seconds: float) -> Cost:
    return Cost(rule, device_bytes / 1e9, host_bytes / 1e9, disk_bytes / 1e9, seconds)


def job_resources(
    rule: str,
    shape: Shape,
    cfg: dict,
    n_windows: int,
    attempt: int = 1,
    device: str = "gpu",
    start: int = 0,
) -> dict:
    """Snakemake resources of one job over ``n_windows`` windows from ``start``: ``mem_mb`` (host), ``runtime``
    (minutes), ``gpu_mem_mb`` (0 off the GPU) and ``disk_mb``; memory and runtime grow by ``RETRY_GROWTH`` per
    retry (``attempt`` 2, 3, ...), after an out-of-memory or time-limit failure."""
    if n_windows < 1 or attempt < 1:
        raise ValueError(f"job_resources: n_windows {n_windows} and attempt {attempt} must be >= 1")
    cost = job_cost(rule, shape, cfg, (start, start + n_windows), device)
    grow = RETRY_GROWTH ** (attempt - 1)
    return {
        "mem_mb": math.ceil(max(MIN_MEM_MB, cost.host_gb * 1e3 * MEM_MARGIN) * grow),
        # twice the estimate: the rates are sustained averages, a slow node or file system must not kill the job
        "runtime": math.ceil(max(MIN_RUNTIME_MIN, 2 * cost.seconds / 60) * grow),
        "gpu_mem_mb": math.ceil(cost.device_gb * 1e3 * MEM_MARGIN * grow),
        "disk_mb": math.ceil(cost.disk_gb * 1e3 * MEM_MARGIN) + 1,
    }


# Before a model is acquired (a dry run, the DAG's first pass) its shape may be unknown: these asks stand in;
# Snakemake evaluates the resources again once the job's input exists, just before it runs.
UNKNOWN_SHAPE_RESOURCES = {"mem_mb": 64000, "runtime": 240, "gpu_mem_mb": 80000, "disk_mb": 100000}


def resource_names(rule: str) -> tuple[str, ...]:
    """The resources :func:`rule_resources` sets for ``rule``: ``gpu`` only on the GPU rules."""
    return ("mem_mb", "runtime", "gpu_mem_mb", "disk_mb") + (("gpu",) if rule in GPU_RULES else ())


def rule_resources(
    rule: str, model_dir: str | Path, entry: dict, variant: str, shard: str | None, cfg: dict, attempt: int = 1
) -> dict:
    """Snakemake resources of one job of ``rule`` (what ``rules/resources.smk`` hands Snakemake): the model's
    shape from ``model_dir/config.json`` (else its recorded shape), the windows from ``shard`` ("<start>-<stop>";
    None: all windows of the rule), ``gpu`` = the entry's ``gpus`` (default 1) on GPU rules; the figures are those
    of a GPU job unless the config's ``device`` is ``cpu``."""
    total = rule_windows(rule, cfg)
    start, stop = parse_shard(shard) if shard else (0, total)
    device = "cpu" if cfg.get("device") == "cpu" else "gpu"
    shape = model_shape_at(model_dir, entry, variant)
    if shape is None:
        out = dict(UNKNOWN_SHAPE_RESOURCES)
    else:
        out = job_resources(rule, shape, cfg, stop - start, attempt, device, start=start)
    if rule in GPU_RULES:  # asked for even when the config runs on the CPU, as the profile's constants were
        out["gpu"] = int(entry.get("gpus", 1))
    return out


@dataclass(frozen=True)
class Row:
    model: str
    variant: str
    shard: str
    cost: Cost | None  # None: shape unknown


def plan(cfg: dict, *, models_dir: str | Path = MODELS_DIR, device: str = "gpu") -> list[Row]:
    """One row per heavy job of the first family (extract, decompose + bands in store mode, perturb, cap,
    head_ablation, band_interventions) per (model, variant, shard); a model of unknown shape gets one row with
    ``cost`` None."""
    rows = []
    for entry in cfg["models"]:
        shape = model_shape(entry, models_dir)
        for variant in step_variants(cfg):
            if shape is None:
                rows.append(Row(entry["name"], variant, "-", None))
                continue
            for rule in planned_rules(cfg):
                if variant not in step_variants(cfg, rule):  # a control the config leaves out (random_init)
                    continue
                for start, stop in rule_shards(rule, cfg):
                    cost = job_cost(rule, shape, cfg, (start, stop), device)
                    rows.append(Row(entry["name"], variant, f"{start}-{stop}", cost))
    return rows


def totals(rows: list[Row]) -> dict:
    known = [r.cost for r in rows if r.cost is not None]
    return {
        "jobs": len(known),
        "disk_gb": sum(c.disk_gb for c in known),
        "refs_gb": sum(c.refs_gb for c in known),
        "hours": sum(c.seconds for c in known) / 3600,
        "unknown": sorted({r.model for r in rows if r.cost is None}),
    }


def main(argv=None) -> None:
    from posgen import config as posgen_config

    parser = argparse.ArgumentParser(prog="python -m posgen.plan", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configfile", nargs="+", default=["config.yaml"], help="config files, merged key by key as Snakemake does"
    )
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--models-dir", default=MODELS_DIR)
    parser.add_argument("--totals", action="store_true", help="print the totals only")
    parser.add_argument("--study", help="a synthetic collection (e.g. decisive_study): its training plan instead")
    args = parser.parse_args(argv)
    try:
        cfg = posgen_config.load(*args.configfile)
    except posgen_config.ConfigError as err:
        raise SystemExit(f"posgen.plan: {err}") from None
    if args.study:
        from posgen.synthetic.cost import study_plan

        return print(study_plan(cfg, args.study, args.configfile, args.device))
    try:
        rows = plan(cfg, models_dir=args.models_dir, device=args.device)
    except (KeyError, ValueError) as err:
        raise SystemExit(f"posgen.plan: {err.args[0]}") from None
    opts = config_options(cfg)
    unit = "GPU" if args.device == "gpu" else "CPU"
    rates = committed_rates(args.device)[1]
    print(
        f"plan for {' '.join(args.configfile)} on {args.device} ({rates}): {cfg['n_samples']} windows x {cfg['seq_len']} tokens, "
        f"{opts['shards']} shard(s), analysis {opts['analysis']}, keep_qk {opts['keep_qk']} in {opts['qk_dtype']}"
    )
    if not args.totals:
        print(
            f"{'model':16s} {'variant':14s} {'job':18s} {'shard':>7s} {'GPU GB':>7s} {'host GB':>8s} "
            f"{'disk GB':>8s} {'hours':>7s}"
        )
        for row in rows:
            if row.cost is None:
                print(f"{row.model:16s} {row.variant:14s} shape unknown (no config.json yet, not a recorded shape)")
                continue
            c = row.cost
            print(
                f"{row.model:16s} {row.variant:14s} {c.rule:18s} {row.shard:>7s} {c.device_gb:7.1f} {c.host_gb:8.1f} "
                f"{c.disk_gb:8.3f} {c.seconds / 3600:7.3f}"
            )
    t = totals(rows)
    print(
        f"total: {t['jobs']} jobs, disk {t['disk_gb']:.1f} GB (of which reference logits {t['refs_gb']:.1f} GB), "
        f"{t['hours']:.1f} {unit}-hours"
    )
    if t["unknown"]:
        print(f"unknown shape (not counted): {', '.join(t['unknown'])}")


if __name__ == "__main__":
    main()
