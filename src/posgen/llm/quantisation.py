"""How much the 4-bit rounding of the trained weights can move the first paper's numbers (docs/method.md section 6.3;
issue 60 item 4; rules QUANT_NOISE, QUANT_R, QUANT_LOW registered before any run).

The embedded models are de-quantised GGUF files: every block of 32 consecutive weights of a row holds 16 levels
``w = d q + m`` (Q4_1; Q4_K's 32-weight sub-blocks alike, their scales themselves quantised). The rounding that made
them is at most half a step ``d`` per weight: as noise, uniform with variance ``d^2 / 12``. So the trained model is
perturbed by Gaussian noise of each block's variance ``d^2 / 12``, with ``d = (max - min) / 15`` of the block's
de-quantised values (exact for Q4_1, whose extremes are levels 0 and 15; an estimate for Q4_K), on W_q and W_k
and, separately, on every matrix (1-D weights, the norms, are stored unquantised and kept); then the same windows
are captured and decomposed, and every number the first paper's verdicts read on the trained model is compared
with the unperturbed model's on the same windows.

The study runs on the notebook API: ``python -m posgen.quantisation_study --source embedded:smollm2-135m --windows 4
--seeds 0 1`` prints the table.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.verdict_rules import value

BLOCK = 32  # weights per quantisation block (Q4_1, and the sub-blocks of Q4_K)
LEVELS = 15  # steps between a 4-bit block's lowest and highest level
QUANT_R = value("QUANT_R")  # |change| of a row-centred mean or pooled r that the rounding may make
QUANT_LOW = value("QUANT_LOW")  # |change| of a low-frequency share that the rounding may make
TARGETS = {"qk": ("q_proj", "k_proj"), "every": ()}  # which matrices get the noise ("every": all of them)


def block_steps(weight: torch.Tensor) -> torch.Tensor:
    """Each block's step ``d = (max - min) / 15`` over blocks of :data:`BLOCK` consecutive weights of a row,
    broadcast to every weight: ``weight``'s shape. A row whose length is not a multiple of the block keeps its last
    partial block."""
    rows = weight.detach().reshape(-1, weight.shape[-1]).double()  # (row, column)
    pad = -rows.shape[1] % BLOCK
    padded = torch.nn.functional.pad(rows, (0, pad), value=float("nan"))  # (row, (block, 32))
    blocks = padded.view(rows.shape[0], -1, BLOCK)  # (row, block, 32)
    span = blocks.nan_to_num(float("-inf")).amax(-1) - blocks.nan_to_num(float("inf")).amin(-1)  # (row, block)
    step = (span / LEVELS)[..., None].expand(-1, -1, BLOCK)  # (row, block, 32)
    return step.reshape(rows.shape[0], -1)[:, : rows.shape[1]].reshape(weight.shape)


def add_rounding_noise(model: torch.nn.Module, which: str, seed: int) -> int:
    """Adds Gaussian noise of each block's rounding variance ``d^2 / 12`` to the matrices of ``which``
    (:data:`TARGETS`), in place; the number of weights perturbed."""
    names = TARGETS[which]
    gen = torch.Generator().manual_seed(int(seed))
    count = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim < 2 or (names and not any(part in name for part in names)):
                continue
            std = block_steps(param) / np.sqrt(12.0)  # (same shape), float64
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64) * std
            param.add_(noise.to(param.dtype))
            count += param.numel()
    return count


def numbers(qk, decomposition) -> dict[str, float]:
    """The trained-model numbers the first paper's verdicts read, on these windows (sink 'with', every RoPE
    layer): Method A's and B's row-centred mean and pooled r, their raw ones, and the low-frequency shares of the
    keys' and queries' token variance."""
    from posgen.llm.bands import BandTable, low_frequency_share
    from posgen.llm.summary import RC_SUFF

    sinks, methods = list(decomposition["sink"].values), list(decomposition["method"].values)
    dec = decomposition.isel(sink=sinks.index("with"))
    out = {}
    for method in ("A", "B"):
        one = dec.isel(method=methods.index(method))  # by position: the method labels are not an index here
        out[f"{method}_mean_rc"] = float(np.nanmean(one["r_rc"].values))
        sums = [float(np.nansum(one[name].values)) for name in RC_SUFF]  # xx, yy, xy
        out[f"{method}_pooled_rc"] = sums[2] / np.sqrt(sums[0] * sums[1])
        out[f"{method}_mean_r"] = float(np.nanmean(one["r"].values))
    table = BandTable(qk, qk.sizes["sample"])
    for s_ in range(qk.sizes["sample"]):
        for l_ in range(qk.sizes["layer"]):
            table.add(l_, qk["q"].isel(sample=s_, layer=l_).values, qk["k"].isel(sample=s_, layer=l_).values)
    bands = table.dataset({})
    theta = bands["theta"].values
    theta = theta[0] if theta.ndim > 1 else theta
    for side, head in (("q", "head"), ("k", "kv_head")):
        var = bands[f"{side}_var"].transpose("layer", head, "band").values
        out[f"low_share_{side}"] = float(np.nanmean(low_frequency_share(var, theta)))
    return out


THRESHOLD = {name: QUANT_R for name in ("A_mean_rc", "A_pooled_rc", "B_mean_rc", "B_pooled_rc")}
THRESHOLD.update(low_share_q=QUANT_LOW, low_share_k=QUANT_LOW)
