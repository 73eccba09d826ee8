"""Per-head ablation of a classifier (docs/method.md section 8.4; the deposit statistics of its drops are
``posgen.stats.deposit_statistics``).

Ablating head h of layer l zeroes its value vectors (``head_gate``), so it adds nothing to the layer's output.
Three readings per layer, all on the same test samples:

* single-head: each head ablated alone; ``drop = base accuracy - ablated accuracy``;
* leave-one-in: every other head of the layer ablated, this one kept (``kept_accuracy``); with the
  whole-layer ablation (``layer_accuracy``) it tells redundancy (heads that can stand in for each other: small
  single drops, a large whole-layer drop, one kept head restores most of it) from a layer where every head
  matters (large single drops, and no kept head alone restores the base accuracy);
* per layer from the single-head drops: top drop, second drop, the top head, the deposit index
  ``top / sum of positive drops`` (NaN when the top drop is under ``MIN_TOP_DROP``: no head matters, so there
  is nothing to concentrate), and the paper's criterion (top >= 30 points and second <= 5 points).

A layer's ablations reuse the residual stream an ungated pass gave that layer (``Classifier.resume``), so a
layer-l ablation recomputes only layers l and above.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.synthetic.model import batch_tokens


@torch.no_grad()
def _gated_accuracies(model, tokens, labels, layers, gates_of, batch_size: int) -> tuple[float, np.ndarray]:
    """Base accuracy and, per layer of ``layers``, the accuracy under each gate of ``gates_of(H)`` (n, H)."""
    was_training = model.training
    model.eval()
    H = model.dims.n_heads
    gates = gates_of(H).to(tokens.device)  # (n_gates, H)
    correct_base = 0
    correct = np.zeros((len(layers), len(gates)))
    for start in range(0, len(labels), batch_size):
        x = batch_tokens(tokens[start : start + batch_size], model.dims.faithful)
        y = labels[start : start + batch_size]
        states = model.hidden_states(x)  # L + 1 tensors (B, T, D)
        correct_base += int((model.classify(states[-1], x != 0).argmax(-1) == y).sum())
        for i, layer in enumerate(layers):
            for g, gate in enumerate(gates):
                correct[i, g] += int((model.resume(x, layer, states[layer], gate).argmax(-1) == y).sum())
    model.train(was_training)
    n = len(labels)
    return correct_base / n, correct / n


def single_head_accuracy(model, tokens, labels, layers, batch_size: int = 1024) -> tuple[float, np.ndarray]:
    """Base accuracy and the accuracy with each head of ``layers`` ablated alone: (len(layers), head)."""
    return _gated_accuracies(model, tokens, labels, layers, lambda H: 1 - torch.eye(H), batch_size)


def leave_one_in_accuracy(model, tokens, labels, layers, batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Per layer of ``layers``: the accuracy with only head h kept (len(layers), head) and with every head of
    the layer ablated (len(layers),)."""
    _, kept = _gated_accuracies(model, tokens, labels, layers, lambda H: torch.eye(H), batch_size)
    _, none = _gated_accuracies(model, tokens, labels, layers, lambda H: torch.zeros(1, H), batch_size)
    return kept, none[:, 0]
