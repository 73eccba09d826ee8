"""The 4-bit bound's study (posgen.llm.quantisation, docs/method.md section 6.3) on the notebook API: the trained
model and its copies with each block's rounding noise, captured and decomposed on the same windows, every number
the first paper's verdicts read compared with the unperturbed model's. ``python -m posgen.quantisation_study
--source embedded:smollm2-135m --windows 4 --seeds 0 1`` prints the table."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import torch

from posgen import api
from posgen.llm.quantisation import QUANT_LOW, QUANT_R, TARGETS, THRESHOLD, add_rounding_noise, numbers


def study(source: str, n_windows: int, seq_len: int, seeds, window_seed: int = 0, cache=None) -> pd.DataFrame:
    """One row per (noise target, seed) and one for the unperturbed model: every number of :func:`numbers` and its
    change from the unperturbed model's; ``within`` whether every change the rules bound is within them.
    ``cache``: where the model is acquired (posgen.api.model_folder's)."""
    source = api.model_folder(source, cache)
    loaded = api.load(source)
    windows = api.windows(loaded, n_samples=n_windows, seq_len=seq_len, seed=window_seed)
    runs = [("none", -1)] + [(which, seed) for which in TARGETS for seed in seeds]
    rows = []
    for which, seed in runs:
        model, tokenizer, manifest = api.load(source) if which != "none" else loaded
        perturbed = add_rounding_noise(model, which, seed) if which != "none" else 0
        qk = api.capture_qk((model, tokenizer, manifest), windows, check=False)
        decomposition = api.decompose(qk, bound_rows=64)  # the bound (checked, not read here) on 64 rows
        rows.append({"noise": which, "seed": seed, "weights": perturbed, **numbers(qk, decomposition)})
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    for name, bound in THRESHOLD.items():
        table[f"d_{name}"] = table[name] - base[name]
    table["within"] = np.all([table[f"d_{n}"].abs() <= b for n, b in THRESHOLD.items()], axis=0)
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posgen.quantisation_study", description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="embedded:smollm2-135m")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    table = study(args.source, args.windows, args.seq_len, args.seeds)
    print(f"QUANT_R {QUANT_R}, QUANT_LOW {QUANT_LOW}; {args.windows} windows x {args.seq_len} tokens of {args.source}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


if __name__ == "__main__":
    main()
