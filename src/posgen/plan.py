"""What a run will cost before anything is submitted: per job, the device memory, host memory, disk written and
time, from the model's shape and the config (docs/slurm.md, "Planning a run").

    python -m posgen.plan --configfile config.paper.yaml [--device gpu|cpu]

The model (docs/slurm.md has the derivation):

* FLOPs of one forward pass over T tokens: ``2 P_body T + 2 L H d T^2`` (the projections and MLPs of the
  ``P_body`` non-embedding parameters, plus causal QK^T and AV). A job's time is its FLOPs over the device's
  sustained rate (``--gpu-tflops``, ``--cpu-gflops``); the decomposition's error-and-bound pass is ``L H T^2 d``
  multiply-adds per bound sample and its moments ``L H T d^2`` per sample.
* Device memory: the weights in the run's dtype plus one window's activations (hidden and MLP states, the
  float32 reference logits of one layer, and the eager attention matrix when the model soft-caps).
* Host memory: one window's q/k of every layer in float32 (they leave the device as soon as they are produced)
  plus the reference logits, plus the weights while they load.
* Disk: ``qk.h5`` is ``N L (H + H_kv) T d 4`` bytes plus ``H T^2 4`` per reference (sample, layer).

Shapes come from the acquired ``config.json`` when the model is in ``resources/models/``, else from the recorded
shapes of :mod:`posgen.shapes`; a model with neither is listed as unknown.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from posgen import config as posgen_config
from posgen.shapes import SHAPES, shape_config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Sustained rates: the CPU one is this project's 2-core test machine (python -m posgen.bench scale); the GPU one
# is an assumption for an A100/H100-class GPU in bfloat16 at ~30 % of peak, to be replaced by a measured figure.
CPU_GFLOPS = 60.0
GPU_TFLOPS = 100.0
# Method B, the sink readings and the dummy-distance sweep multiply the moment pass by about this factor.
DECOMPOSE_PASSES = 8


@dataclass(frozen=True)
class Shape:
    """What the cost model reads from a model config."""

    n_params: int
    n_embedding: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    softcap: bool

    @classmethod
    def from_config(cls, config) -> "Shape":
        from posgen.shapes import parameter_count

        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        n_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        n_embedding = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
        return cls(
            n_params=parameter_count(config),
            n_embedding=n_embedding,
            n_layers=config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
            head_dim=head_dim,
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            softcap=bool(getattr(config, "attn_logit_softcapping", None)),
        )

    def forward_flops(self, n_tokens: int) -> float:
        body = self.n_params - self.n_embedding
        return 2 * body * n_tokens + 2 * self.n_layers * self.n_heads * self.head_dim * n_tokens**2

    def qk_bytes(self, n_tokens: int) -> int:
        """One window's pre-RoPE q/k of every layer, float32."""
        return self.n_layers * (self.n_heads + self.n_kv_heads) * n_tokens * self.head_dim * 4

    def logits_bytes(self, n_tokens: int) -> int:
        """One layer's float32 attention logits for one window."""
        return self.n_heads * n_tokens * n_tokens * 4


@dataclass(frozen=True)
class Cost:
    job: str
    device_gb: float
    host_gb: float
    disk_gb: float
    seconds: float


def model_shape(entry: dict, models_dir: Path) -> Shape | None:
    """The shape of a config's model entry: its acquired config.json, else a recorded shape, else None."""
    acquired = models_dir / entry["name"] / "config.json"
    if acquired.exists():
        from transformers import AutoConfig

        return Shape.from_config(AutoConfig.from_pretrained(acquired.parent))
    for name in (entry["name"], entry["source"].partition(":")[2]):
        if name in SHAPES:
            return Shape.from_config(shape_config(name))
    return None


def _rate(device: str, gpu_tflops: float, cpu_gflops: float) -> float:
    return gpu_tflops * 1e12 if device == "gpu" else cpu_gflops * 1e9


def extract_cost(shape: Shape, cfg: dict, weight_bytes: int, rate: float) -> Cost:
    T, N = cfg["seq_len"], cfg["n_samples"]
    n_ref = len(cfg["extract"]["ref_samples"]) * len(cfg["extract"]["ref_layers"])
    weights = shape.n_params * weight_bytes
    activations = T * (6 * shape.hidden + 3 * shape.intermediate) * weight_bytes + shape.logits_bytes(T)
    if shape.softcap:  # eager attention materialises the attention matrix
        activations += shape.logits_bytes(T) * 2
    return Cost(
        "extract",
        device_gb=(weights + activations) / 1e9,
        host_gb=(weights + shape.qk_bytes(T) + n_ref * shape.logits_bytes(T) / len(cfg["extract"]["ref_samples"]))
        / 1e9,
        disk_gb=(N * shape.qk_bytes(T) + n_ref * shape.logits_bytes(T)) / 1e9,
        seconds=N * shape.forward_flops(T) / rate,
    )


def decompose_cost(shape: Shape, cfg: dict, rate: float) -> Cost:
    T, N = cfg["seq_len"], cfg["n_samples"]
    dec = cfg["decomposition"]
    bound = min(dec["bound_samples"], N) if dec["bound_samples"] else N
    L, H, d = shape.n_layers, shape.n_heads, shape.head_dim
    flops = 2 * L * H * (bound * T * T * d + DECOMPOSE_PASSES * N * T * d * d)
    one_unit = (H + shape.n_kv_heads) * T * d * 4
    return Cost(
        "decompose",
        device_gb=(one_unit * 8 + H * T * T * 4) / 1e9,  # operands in float64 plus one head block of entries
        host_gb=one_unit * 4 / 1e9,
        disk_gb=N * L * H * 200 * 8 / 1e9,
        seconds=flops / rate,
    )


def perturb_cost(shape: Shape, cfg: dict, weight_bytes: int, rate: float) -> Cost:
    p = cfg["perturb"]
    T, N = p["seq_len"], p["n_samples"]
    passes = 1 + 6 * sum(1 for r in p["rates"] if r > 0)  # six perturbation kinds
    # Method A's f and g of every layer, per pass: two T x T products per head
    terms = 4 * shape.n_layers * shape.n_heads * T * T * shape.head_dim
    return Cost(
        "perturb",
        device_gb=(shape.n_params * weight_bytes + N * shape.logits_bytes(T) * shape.n_layers * 2) / 1e9,
        host_gb=(shape.n_params * weight_bytes + N * shape.qk_bytes(T) * 2) / 1e9,
        disk_gb=0.001,
        seconds=passes * N * (shape.forward_flops(T) + terms) / rate,
    )


def plan(cfg: dict, *, models_dir: Path, device: str, gpu_tflops: float, cpu_gflops: float) -> list[tuple]:
    """Rows (model, variant, Cost) for every planned job of the first family; Cost None for an unknown shape."""
    rate = _rate(device, gpu_tflops, cpu_gflops)
    weight_bytes = DTYPE_BYTES[cfg["dtype"]] if device == "gpu" else 4
    rows = []
    for entry in cfg["models"]:
        shape = model_shape(entry, models_dir)
        for variant in posgen_config.variants(cfg):
            if shape is None:
                rows.append((entry["name"], variant, None))
                continue
            rows.append((entry["name"], variant, extract_cost(shape, cfg, weight_bytes, rate)))
            rows.append((entry["name"], variant, decompose_cost(shape, cfg, rate)))
            rows.append((entry["name"], variant, perturb_cost(shape, cfg, weight_bytes, rate)))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posgen.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", default="config.yaml")
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--gpu-tflops", type=float, default=GPU_TFLOPS, help="sustained TFLOP/s of one GPU")
    parser.add_argument("--cpu-gflops", type=float, default=CPU_GFLOPS, help="sustained GFLOP/s of one job's CPUs")
    parser.add_argument("--models-dir", default="resources/models")
    args = parser.parse_args(argv)
    try:
        cfg = posgen_config.load(args.configfile)
    except posgen_config.ConfigError as err:
        raise SystemExit(f"posgen.plan: {err}") from None
    rows = plan(
        cfg,
        models_dir=Path(args.models_dir),
        device=args.device,
        gpu_tflops=args.gpu_tflops,
        cpu_gflops=args.cpu_gflops,
    )
    unit = "GPU" if args.device == "gpu" else "CPU"
    print(f"plan for {args.configfile} on {args.device} ({json.dumps({'seq_len': cfg['seq_len'], 'n_samples': cfg['n_samples']})})")
    print(f"{'model':16s} {'variant':14s} {'job':10s} {unit + ' mem GB':>11s} {'host GB':>8s} {'disk GB':>8s} {'hours':>7s}")
    total_disk = total_hours = 0.0
    for model, variant, cost in rows:
        if cost is None:
            print(f"{model:16s} {variant:14s} shape unknown until get_model has run")
            continue
        total_disk += cost.disk_gb
        total_hours += cost.seconds / 3600
        print(
            f"{model:16s} {variant:14s} {cost.job:10s} {cost.device_gb:11.1f} {cost.host_gb:8.1f} "
            f"{cost.disk_gb:8.2f} {cost.seconds / 3600:7.2f}"
        )
    print(f"total: disk {total_disk:.1f} GB, {total_hours:.1f} {unit}-hours")


if __name__ == "__main__":
    main()
