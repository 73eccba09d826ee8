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
of :mod:`posgen.shapes` (by name or hub id); a model with neither is listed as unknown.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from posgen.config import schema_default, schema_defaults
from posgen.numerics import DENSE_TOKENS, SMOOTH_DEGREE, TOKEN_BLOCK
from posgen.paths import MODELS_DIR
from posgen.rates import Rates, committed_rates
from posgen.shapes import SHAPES
from posgen.workflow.sharding import parse_shard, rule_shards, rule_windows
from posgen.workflow.steps import GPU_RULES, MODEL_JOB_RULES, planned_rules, step_variants

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CG_STEPS = 20  # Method B's conjugate gradients per sink (15-25 measured)
CG_PASSES = 40  # passes over the unknowns per step (posgen.decomposition.design.AdditiveDesign.normal)
CAPTURE_OVERHEAD = 1.3  # extraction through the capturing backend over a plain forward pass (bench scale)
RETRY_GROWTH = 1.5  # memory and runtime asked for on attempt a: (RETRY_GROWTH ** (a - 1)) x the estimate
MEM_MARGIN = 1.25  # safety margin on every memory ask
MIN_MEM_MB = 2000
MIN_RUNTIME_MIN = 10


# --------------------------------------------------------------------------------------------------- shapes


def widest_head(c: dict, default: int) -> int:
    """A config dict's q/k head size; where it varies by layer (Gemma 4's full layers: ``global_head_dim`` or a
    ``per_layer_config`` override), the widest, which qk.h5 stores every layer at (docs/data-model.md)."""
    sizes = [int(c.get("head_dim") or default), int(c.get("global_head_dim") or 0)]
    sizes += [int(o.get("head_dim") or 0) for o in (c.get("per_layer_config") or {}).values() if isinstance(o, dict)]
    return max(sizes)


@dataclass(frozen=True)
class Shape:
    """What the cost model reads from a model config (``config.json`` keys; parameter counts analytic)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    sliding_window: int = 0  # 0: every layer global
    n_sliding: int = 0  # layers with the sliding window
    softcap: bool = False

    @classmethod
    def from_dict(cls, config: dict) -> "Shape":
        """From a ``config.json`` dict (a multimodal config's ``text_config`` wins)."""
        c = {**config, **config.get("text_config", {})}
        try:
            n_heads = int(c["num_attention_heads"])
            hidden = int(c["hidden_size"])
            n_layers = int(c["num_hidden_layers"])
            intermediate = int(c["intermediate_size"])
            vocab = int(c["vocab_size"])
        except KeyError as err:
            raise KeyError(f"model config: no {err.args[0]!r} (not a decoder config this plan can read)") from None
        window = int(c.get("sliding_window") or 0)
        types = c.get("layer_types")
        if types:
            n_sliding = sum(t == "sliding_attention" for t in types[:n_layers])
        elif c.get("model_type") == "gemma2":
            n_sliding = (n_layers + 1) // 2  # alternating local/global, local first
        elif c.get("model_type") in ("gemma3", "gemma3_text"):
            pattern = int(c.get("sliding_window_pattern", 6))  # every pattern-th layer is global
            n_sliding = n_layers - n_layers // pattern
        elif c.get("model_type") in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
            n_sliding = 0
        else:
            n_sliding = n_layers if window else 0
        return cls(
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
            head_dim=widest_head(c, hidden // n_heads),
            hidden=hidden,
            intermediate=intermediate,
            vocab=vocab,
            tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
            sliding_window=window if n_sliding else 0,
            n_sliding=n_sliding,
            softcap=bool(c.get("attn_logit_softcapping")),
        )

    @property
    def n_body(self) -> int:
        """Parameters of the decoder layers (attention, gated MLP, norms): what every token multiplies."""
        H, Hkv, d, D = self.n_heads, self.n_kv_heads, self.head_dim, self.hidden
        attention = D * d * (2 * H + 2 * Hkv) + (H + 2 * Hkv) * d * self.qkv_bias
        return self.n_layers * (attention + 3 * D * self.intermediate + 4 * D)

    @property
    def n_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.n_body + embeddings + self.hidden

    def windows(self, n_tokens: int) -> list[int]:
        """The distinct attention masks of the analysis: 0 (global) and the sliding window if it is < T."""
        out = [0] if self.n_sliding < self.n_layers else []
        if self.n_sliding and 0 < self.sliding_window < n_tokens:
            out.append(self.sliding_window)
        elif self.n_sliding:
            out = [0]
        return out

    def qk_bytes(self, n_tokens: int, dtype: str = "float32") -> int:
        """One window's pre-RoPE q/k of every layer in ``dtype``."""
        return self.n_layers * (self.n_heads + self.n_kv_heads) * n_tokens * self.head_dim * DTYPE_BYTES[dtype]

    def logits_bytes(self, n_tokens: int) -> int:
        """One layer's float32 attention logits of one window."""
        return self.n_heads * n_tokens * n_tokens * 4


def model_shape(entry: dict, models_dir: str | Path = MODELS_DIR) -> Shape | None:
    """The shape of a config's model entry: its acquired config.json, else a recorded shape, else None."""
    acquired = Path(models_dir) / entry["name"] / "config.json"
    if acquired.exists():
        return Shape.from_dict(json.loads(acquired.read_text()))
    source = entry.get("source", "")
    names = [entry["name"], source.partition(":")[2]]
    names.append(names[1].split("@")[0].split("/")[-1].lower())  # hf:meta-llama/Llama-3.1-8B@... -> llama-3.1-8b
    for name in names:
        if name in SHAPES:
            return Shape.from_dict(SHAPES[name])
    return None


# ----------------------------------------------------------------------------------------------- FLOPs


def forward_flops(shape: Shape, n_tokens: int) -> float:
    """One window through the decoder layers: projections and MLPs plus causal QK^T and AV."""
    T = n_tokens
    return 2 * shape.n_body * T + 2 * shape.n_layers * shape.n_heads * shape.head_dim * T * T


def _n_delta(n_tokens: int, window: int) -> int:
    return window or n_tokens


def moments_flops(shape: Shape, n_tokens: int, n_distances: int, window: int = 0) -> float:
    """masked_moments of one (window, layer), float64: Gram matrices and key-side products, ragged columns."""
    H, Hkv, d, T = shape.n_heads, shape.n_kv_heads, shape.head_dim, n_tokens
    C = TOKEN_BLOCK * (3 if window else 1)
    k = 3 + n_distances  # key sets [x | f | phi] and every g_D
    return (26 * H + 2 * Hkv) * T * d * d + 2 * H * T * C * d * k + 2 * H * T * C * k * k


def method_b_cost(shape: Shape, n_tokens: int, window: int = 0) -> tuple[float, float]:
    """(FLOPs, bytes streamed) of Method B on one (window, layer): the FFT sums, and the conjugate gradients on
    both sinks (every head at once), each step a few prefix sums over the unknowns."""
    T = n_tokens
    n_z = 2 * T + _n_delta(T, window)
    fft = 10 * (shape.n_heads + shape.n_kv_heads) * shape.head_dim * 2 * T * math.log2(2 * T)
    return fft, 2 * CG_STEPS * CG_PASSES * shape.n_heads * n_z * 8


def error_flops(shape: Shape, n_tokens: int, window: int = 0) -> float:
    """The error-and-bound pass of one (window, layer): the error product ``4 d``, the bound's slow and fast
    bands ``~3 d / 2`` and about 8 elementwise operations per counted entry (two sinks)."""
    T, H, d = n_tokens, shape.n_heads, shape.head_dim
    pairs = T * min(T, window) if window else T * T / 2  # counted entries of one head, per sink
    return (4 * d + 1.5 * d + 8) * H * 2 * pairs


def _layer_windows(shape: Shape, n_tokens: int) -> list[tuple[int, int]]:
    """(effective window, number of layers) over the layers."""
    window = shape.sliding_window if 0 < shape.sliding_window < n_tokens else 0
    if not window:
        return [(0, shape.n_layers)]
    return [(0, shape.n_layers - shape.n_sliding), (window, shape.n_sliding)]


def analysis_parts(shape: Shape, cfg: dict, n_windows: int, n_bound: int, rates: Rates) -> dict:
    """Seconds of the decomposition of ``n_windows`` windows (``n_bound`` of them with the error bound) by part:
    ``moments``, ``method_b``, ``error``; and ``bands``."""
    T = cfg["seq_len"]
    dec = cfg["decomposition"]
    n_distances = len(set(dec["dummy_distances"]) | {dec["dummy_distance"]})
    parts = dict.fromkeys(("moments", "method_b", "error"), 0.0)
    for window, n_layers in _layer_windows(shape, T):
        parts["moments"] += n_windows * n_layers * moments_flops(shape, T, n_distances, window) / rates.moments
        flops, read = method_b_cost(shape, T, window)
        parts["method_b"] += n_windows * n_layers * (flops / rates.factor + read / rates.memory)
        parts["error"] += n_bound * n_layers * error_flops(shape, T, window) / rates.error
    # feature bands: a few elementwise passes over the window's q/k
    parts["bands"] = n_windows * 8 * shape.qk_bytes(T) / 4 / rates.error
    return parts


def analysis_seconds(shape: Shape, cfg: dict, n_windows: int, n_bound: int, rates: Rates, bands: bool = True) -> float:
    """Decomposition (and feature bands) of ``n_windows`` windows, ``n_bound`` of them with the error bound."""
    parts = analysis_parts(shape, cfg, n_windows, n_bound, rates)
    return sum(v for k, v in parts.items() if bands or k != "bands")


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


def _analysis_memory(shape: Shape, n_tokens: int, device: str) -> int:
    """Working set of one layer's analysis: the moments' Grams, Method B's vectors, the error blocks. On a GPU
    the device layout (posgen.decomposition.Decomposer ``batched``): every KV head's Grams at once, and up to
    DENSE_TOKENS Method B's factorised normal matrices (two sinks, kept for the job) and their construction."""
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
    return method_b + grams + operands + 8 * block * 4


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


def model_shape_at(model_dir: str | Path, entry: dict, variant: str = "") -> Shape | None:
    """The shape of an acquired model folder (a checkpoint series keeps its config in ``<variant>/``), else of its
    config entry (:func:`model_shape`)."""
    model_dir = Path(model_dir)
    for folder in (model_dir, model_dir / variant):
        if (folder / "config.json").is_file():
            return Shape.from_dict(json.loads((folder / "config.json").read_text()))
    return model_shape(entry, model_dir.parent)


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
    head_ablation) per (model, variant, shard); a model of unknown shape gets one row with ``cost`` None."""
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
            f"{'model':16s} {'variant':14s} {'job':10s} {'shard':>7s} {'GPU GB':>7s} {'host GB':>8s} "
            f"{'disk GB':>8s} {'hours':>7s}"
        )
        for row in rows:
            if row.cost is None:
                print(f"{row.model:16s} {row.variant:14s} shape unknown (no config.json yet, not a recorded shape)")
                continue
            c = row.cost
            print(
                f"{row.model:16s} {row.variant:14s} {c.rule:10s} {row.shard:>7s} {c.device_gb:7.1f} {c.host_gb:8.1f} "
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
