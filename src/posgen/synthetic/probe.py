"""Linear probes of absolute position in the residual stream (docs/method.md section 8.7).

For each residual stream ``stream`` = 0 (the input: embeddings plus any absolute encoding) and ``stream`` = l
(after layer l), a ridge regression of the token's absolute position on its hidden state, fitted on half of
the samples' real tokens and scored on the other half (held-out R^2). The paper's claim for the absolute + RoPE
hybrid: the additive positional directions are displaced after layer 2, i.e. R^2 high at the input, low deeper.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.synthetic.model import batch_tokens

RIDGE = 1e-3  # relative to the mean feature variance; keeps the solve well posed for collinear features


def held_out_r2(features: np.ndarray, target: np.ndarray, fit: np.ndarray) -> float:
    """R^2 on the rows not in ``fit`` of a ridge fit of ``target (n,)`` on ``features (n, D)`` over ``fit``."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    mean_x, mean_y = x[fit].mean(0), y[fit].mean()
    xf, yf = x[fit] - mean_x, y[fit] - mean_y  # (n_fit, D), (n_fit,)
    gram = xf.T @ xf  # (D, D)
    penalty = RIDGE * np.trace(gram) / gram.shape[0]
    weights = np.linalg.solve(gram + penalty * np.eye(gram.shape[0]), xf.T @ yf)  # (D,)
    test = ~fit
    predicted = (x[test] - mean_x) @ weights + mean_y
    residual = y[test] - predicted
    centred = y[test] - y[test].mean()
    return float(1.0 - residual @ residual / (centred @ centred))


@torch.no_grad()
def position_r2(model, tokens: torch.Tensor) -> np.ndarray:
    """Held-out R^2 of absolute position per residual stream (L + 1,), even samples fit, odd samples scored."""
    was_training = model.training
    model.eval()
    x = batch_tokens(tokens, model.dims.faithful)
    states = model.hidden_states(x)  # L + 1 tensors (B, T, D)
    model.train(was_training)
    real = (x != 0).cpu().numpy()  # (B, T)
    sample, position = np.nonzero(real)
    fit = sample % 2 == 0
    return np.array([held_out_r2(h.cpu().numpy()[sample, position], position, fit) for h in states])
