"""Work you can count on a CPU (issue 52 item 6): the torch operations the fused analysis dispatches, and its host
synchronisation points, per (window, layer) of a model shape. On a GPU each dispatched operation is at least one
kernel launch and each host sync a stall, so the count is the launch cost in advance.

    python -m posgen.bench ops --shape llama-3.1-8b --tokens 512 [--bound] [--heldout] [--layout host|device|both]

Counts one ``Decomposer.unit`` (its per-layer path ``statistics`` and the copy ``to_host``, once per window; ``--bound`` adds the error and bound pass of the bound
windows; ``--heldout`` Method A-shared; ``--layout``: the CPU's layout, the device layout of ``Decomposer(batched=True)``, or both side by
side with their largest difference) on random q/k of the shape's heads (one layer), beside one decoder layer of
the model's own forward pass at that length (random init, eager attention). ``kernels`` leaves out the operations
that only change a view (:data:`VIEW_OPS`), which launch nothing on a GPU. Host syncs: reads of a tensor's value into Python (``item``, ``float``, ``bool``, ``nonzero``, ``tolist``,
``numpy``), counted by torch's dispatch mode and by wrapping ``Tensor.tolist`` / ``Tensor.numpy``. Host data:
tensors made from host values (``torch.tensor`` of a list, an index list), each a blocking copy on a GPU; the q/k
go in as tensors, as the analysis gets them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from posgen.decomposition import Decomposer
from posgen.rope_table import LayerRope
from posgen.shapes import SHAPES

SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.equal")
# a tensor made from host data (``torch.tensor``, an index list): on a GPU, a blocking copy to the device
HOST_DATA_OPS = ("aten.lift_fresh", "aten.lift_fresh_copy")
# operations that only reshape a tensor's view of its storage: dispatched, but no kernel runs on a GPU
VIEW_OPS = (
    "aten.view",
    "aten._unsafe_view",
    "aten.select",
    "aten.slice",
    "aten.permute",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.transpose",
    "aten.t",
    "aten.expand",
    "aten.as_strided",
    "aten.alias",
    "aten.detach",
    "aten.diagonal",
    "aten.unbind",
    "aten.split",
    "aten.split_with_sizes",
)


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched inside it, by name (``aten.mm``), and the host syncs among them."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def kernels(self) -> int:
        """The operations that run a kernel (every one but the views)."""
        return sum(n for name, n in self.ops.items() if name not in VIEW_OPS)

    @property
    def host_data(self) -> int:
        """Tensors made from host data: each a blocking host-to-device copy on a GPU."""
        return sum(n for name, n in self.ops.items() if name in HOST_DATA_OPS)

    @property
    def syncs(self) -> int:
        return sum(n for name, n in self.ops.items() if name in SYNC_OPS)


@contextlib.contextmanager
def counted_reads():
    """Counts ``Tensor.tolist`` and ``Tensor.numpy`` calls (reads to the host that dispatch no aten operation)."""
    reads = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def wrap(name):
        def read(self, *args, **kwargs):
            reads[name] += 1
            return originals[name](self, *args, **kwargs)

        return read

    for name in originals:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def counted_unit(dec: Decomposer, q, k, kv, rope, with_bound: bool, heldout) -> tuple[dict, dict]:
    """One (sample, layer) through ``dec``, counted in its two parts: the per-layer path
    (:meth:`Decomposer.statistics`, ``"layer"``) and the copy to the host with its checks (:meth:`Decomposer.
    to_host`, ``"copy"``: once per window for all its layers); and the unit's statistics."""
    held = {}
    layer = count(lambda: held.__setitem__("unit", dec.statistics(q, k, kv, rope, with_bound, heldout)))
    copy = count(lambda: held.__setitem__("host", dec.to_host([held["unit"]])[0]))
    return {"layer": layer, "copy": copy}, held["host"]


def count(fn) -> dict:
    """Operations, host syncs and reads of one call of ``fn``."""
    with counted_reads() as reads, OpCounter() as ops:
        fn()
    return {
        "ops": ops.total,
        "kernels": ops.kernels,
        "syncs": ops.syncs + sum(reads.values()),
        "host_data": ops.host_data,
        "by_op": dict(ops.ops.most_common(12)),
    }


def layer_inputs(shape: dict, n_tokens: int, seed: int = 0):
    """Random pre-RoPE q (H, T, d), k (H_kv, T, d) with a shared mean, the KV groups and the layer's RoPE."""
    rng = np.random.default_rng(seed)
    n_heads, n_kv = shape["num_attention_heads"], shape.get("num_key_value_heads") or shape["num_attention_heads"]
    d = shape.get("head_dim") or shape["hidden_size"] // n_heads
    theta = float((shape.get("rope_parameters") or {}).get("rope_theta", shape.get("rope_theta", 10000.0)))
    q = (rng.standard_normal((n_heads, n_tokens, d)) + 1.0).astype(np.float32)
    k = (rng.standard_normal((n_kv, n_tokens, d)) + 1.0).astype(np.float32)
    inv_freq = (theta ** (-np.arange(d // 2) / (d // 2))).astype(np.float32)
    return q, k, np.arange(n_heads) // (n_heads // n_kv), LayerRope(inv_freq, d**-0.5)


def forward_layer_ops(shape: dict, n_tokens: int) -> dict:
    """Operations of one decoder layer of the shape's model on ``n_tokens`` tokens (random init, eager)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{**shape, "num_hidden_layers": 1})
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.zeros(1, n_tokens, dtype=torch.long)
    with torch.inference_mode():
        embedded = model.get_input_embeddings()(ids)
        positions = torch.arange(n_tokens)[None]
        rotary = model.model.rotary_emb(embedded, positions)
        layer = model.model.layers[0]
        return count(lambda: layer(embedded, position_embeddings=rotary, position_ids=positions))


def compare_layouts(shape_name: str, n_tokens: int, device: str, repeats: int = 3) -> dict:
    """One layer of ``shape_name`` at ``n_tokens`` through both layouts on ``device`` (Method A-shared on, no
    bound): median seconds per layer of each after a first call (cached designs), the operations and host
    syncs each dispatches, and their largest differences: of r, and over every statistic relative to its largest
    value (``python -m posgen.bench gpu``'s part "layouts")."""
    import time

    shape = SHAPES[shape_name]
    q, k, kv, rope = layer_inputs(shape, n_tokens)
    heldout = torch.from_numpy(np.ascontiguousarray(k[:, ::-1])).to(device)
    dev = torch.device(device)
    q_dev, k_dev = torch.from_numpy(q).to(dev), torch.from_numpy(k).to(dev)

    def synced():
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    out, values = {"setup": [shape_name, n_tokens]}, {}
    for layout in ("host", "device"):
        dec = Decomposer(DISTANCES, DISTANCES[3], device=device, batched=layout == "device")

        def one():
            return dec.unit(q_dev, k_dev, kv, rope, with_bound=False, heldout_k=heldout)

        values[layout] = one()  # builds the cached designs
        seconds = []
        for _ in range(repeats):
            t0 = synced()
            one()
            seconds.append(synced() - t0)
        counted, _ = counted_unit(dec, q_dev, k_dev, kv, rope, False, heldout)
        out[layout] = {
            "seconds_per_layer": float(np.median(seconds)),
            "ops": counted["layer"]["ops"] + counted["copy"]["ops"],
            "kernels": counted["layer"]["kernels"] + counted["copy"]["kernels"],
            "syncs": counted["layer"]["syncs"],  # in the per-layer path; the copy's one is per window
        }
    r_host, r_device = values["host"]["r"], values["device"]["r"]
    out["max_abs_difference_r"] = float(np.nanmax(np.abs(r_host - r_device)))
    out["max_rel_difference"] = max(
        float(np.abs(host - device)[both].max() / np.abs(host)[both].max()) if both.any() else 0.0
        for n, host in values["host"].items()
        if n != "lstsq_residual"  # a residual of ~1e-13: its relative change says nothing
        for device in [values["device"][n]]
        for both in [np.isfinite(host) & np.isfinite(device)]  # the bound's statistics: NaN without the bound
    )
    out["device_over_host"] = out["device"]["seconds_per_layer"] / out["host"]["seconds_per_layer"]
    return out


DISTANCES = [0, 250, 500, 1000, 2000]  # the schema's dummy distances; Method A's D is 1000


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posgen.bench ops", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--bound", action="store_true", help="the bound windows' path (the error and bound pass)")
    parser.add_argument("--heldout", action="store_true", help="Method A-shared on (held-out mean keys)")
    parser.add_argument("--no-forward", action="store_true", help="skip the forward layer (needs transformers)")
    parser.add_argument("--layout", choices=("host", "device", "both"), default="both")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    shape = SHAPES[args.shape]
    q, k, kv, rope = layer_inputs(shape, args.tokens)
    # as the analysis gets them: tensors (on a GPU, copied there once per layer for both tables: posgen.llm.fused)
    heldout = torch.from_numpy(np.ascontiguousarray(k[:, ::-1])) if args.heldout else None
    q, k = torch.from_numpy(q), torch.from_numpy(k)
    layouts = ["host", "device"] if args.layout == "both" else [args.layout]
    result = {"shape": args.shape, "tokens": args.tokens, "bound": args.bound, "heldout": args.heldout}
    values = {}
    for layout in layouts:
        dec = Decomposer(DISTANCES, DISTANCES[3], device="cpu", batched=layout == "device")
        dec.unit(q, k, kv, rope, with_bound=args.bound, heldout_k=heldout)  # the first call builds cached designs
        counted, values[layout] = counted_unit(dec, q, k, kv, rope, args.bound, heldout)
        layer, copy = counted["layer"], counted["copy"]
        result[layout] = {
            "analysis_ops": layer["ops"] + copy["ops"],  # one (sample, layer), its copy to the host included
            "analysis_kernels": layer["kernels"] + copy["kernels"],
            "layer_syncs": layer["syncs"],  # host reads in the per-layer path
            "layer_host_data": layer["host_data"],  # tensors made from host data there (copies to a GPU)
            "copy_syncs": copy["syncs"],  # and in the copy of a window's statistics (once per window)
            "analysis_top_ops": layer["by_op"],
        }
    if len(values) == 2:  # the two layouts' largest difference over every statistic (NaN where both are)
        result["max_abs_difference"] = max(
            float(np.nanmax(np.abs(values["host"][name] - values["device"][name]), initial=0.0))
            for name in values["host"]
        )
    if not args.no_forward:
        forward = forward_layer_ops(shape, args.tokens)
        result.update(forward_layer_ops=forward["ops"], forward_layer_kernels=forward["kernels"])
    print(json.dumps(result))
