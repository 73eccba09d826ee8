"""Linear probes of absolute position in the residual stream (docs/method.md section 8.7).

For each residual stream ``stream`` = 0 (the input: embeddings plus any absolute encoding) and ``stream`` = l
(after layer l), a ridge regression of the token's absolute position on its hidden state, fitted on half of
the samples' real tokens and scored on the other half (held-out R^2). The paper's claim for the absolute + RoPE
hybrid: the additive positional directions are displaced after layer 2. A fresh probe per stream measures
whether position is decodable at all (a RoPE model writes it into the stream itself); the fixed probe of
:func:`position_probes` (``transfer_r2``), fitted on the input and applied unchanged deeper, measures whether the input's directions
survive.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.synthetic.model import batch_tokens

RIDGE = 1e-3  # relative to the mean feature variance; keeps the solve well posed for collinear features


def fit_probe(features: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Ridge fit of ``target (n,)`` on ``features (n, D)``: (weights (D,), feature mean (D,), target mean)."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    mean_x, mean_y = x.mean(0), y.mean()
    xf, yf = x - mean_x, y - mean_y  # (n, D), (n,)
    gram = xf.T @ xf  # (D, D)
    penalty = RIDGE * np.trace(gram) / gram.shape[0]
    weights = np.linalg.solve(gram + penalty * np.eye(gram.shape[0]), xf.T @ yf)  # (D,)
    return weights, mean_x, float(mean_y)


def probe_r2(probe, features: np.ndarray, target: np.ndarray) -> float:
    """R^2 of a fitted probe's predictions of ``target`` from ``features`` (1 - SSE / SST; below 0 when it
    predicts worse than the target's own mean)."""
    weights, mean_x, mean_y = probe
    y = np.asarray(target, dtype=np.float64)
    residual = y - ((np.asarray(features, dtype=np.float64) - mean_x) @ weights + mean_y)
    centred = y - y.mean()
    return float(1.0 - residual @ residual / (centred @ centred))


def held_out_r2(features: np.ndarray, target: np.ndarray, fit: np.ndarray) -> float:
    """R^2 on the rows not in ``fit`` of a ridge fit of ``target (n,)`` on ``features (n, D)`` over ``fit``."""
    probe = fit_probe(features[fit], target[fit])
    return probe_r2(probe, features[~fit], target[~fit])


@torch.no_grad()
def _streams(model, tokens: torch.Tensor):
    """Every residual stream's real-token rows (L + 1 arrays (n, D)), their positions (n,) and the fit half
    (even samples) as a mask."""
    was_training = model.training
    model.eval()
    x = batch_tokens(tokens, model.dims.faithful)
    states = model.hidden_states(x)  # L + 1 tensors (B, T, D)
    model.train(was_training)
    real = (x != 0).cpu().numpy()  # (B, T)
    sample, position = np.nonzero(real)
    rows = [h.cpu().numpy()[sample, position] for h in states]
    return rows, position, sample % 2 == 0


def stream_probes(rows: list[np.ndarray], position: np.ndarray, fit: np.ndarray) -> dict[str, np.ndarray]:
    """Two R^2 of ``position (n,)`` per stream of ``rows`` (arrays (n, D), the input first), scored on the rows
    not in ``fit``:

    * ``position_r2``: a fresh probe per stream, fitted on its ``fit`` rows: whether position is decodable at
      all, wherever it came from;
    * ``transfer_r2``: the probe fitted on the input stream's ``fit`` rows, applied unchanged to every stream:
      whether the input's positional directions themselves survive and still read as position."""
    fixed = fit_probe(rows[0][fit], position[fit])
    return {
        "position_r2": np.array([held_out_r2(h, position, fit) for h in rows]),
        "transfer_r2": np.array([probe_r2(fixed, h[~fit], position[~fit]) for h in rows]),
    }


def position_probes(model, tokens: torch.Tensor) -> dict[str, np.ndarray]:
    """:func:`stream_probes` of a classifier's residual streams (L + 1 each): even samples fit, odd scored."""
    return stream_probes(*_streams(model, tokens))
