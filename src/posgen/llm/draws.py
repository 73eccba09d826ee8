"""Seeded perturbations of a token window: token order and position ids (docs/method.md section 7).

Perturbations (all seeded; position 0 -- the first token, the attention sink -- never moves)
-------------------------------------------------------------------------------------------
A perturbation of a window of T tokens is a pair ``(order, position_ids)``: perturbed position t holds the
original token ``order[t]`` and is rotated by RoPE as position ``position_ids[t]``. The *rate* p is the
fraction of movable units that are perturbed; units are the tokens 1..T-1 (token and posid kinds) or the words
1..W-1 (word kinds; word 0 holds token 0).

* ``token-swap``    ``round(p * U / 2)`` non-overlapping adjacent unit pairs, drawn uniformly, are swapped
  (U = T - 1 movable tokens), so ``2 * round(p * U / 2)`` tokens move.
* ``token-permute`` ``k = round(p * U)`` units (at least 2 when k > 0) are drawn and deranged among their own
  slots (a permutation without fixed points, so exactly k units move).
* ``word-swap``, ``word-permute``: the same on words. A token starts a word when its text starts with a
  space marker (``Ġ``, ``▁``, a space) or a line/tab marker (``Ċ``, ``ĉ``, ``\\n``, ``\\t``); the swapped or
  deranged words are written back as whole blocks, so every token of a moved word changes position.
* ``posid-swap``    token order kept; the position ids of ``round(p * U / 2)`` adjacent pairs are swapped.
* ``posid-jitter``  token order kept; ``round(p * U)`` position ids get a seeded offset drawn uniformly from
  ``{-J..-1, 1..J}`` (J = ``jitter``), clipped at 0.

``moved`` is the fraction of positions 1..T-1 whose token or position id differs from the original;
``moved_units`` the fraction of units moved (what the rate sets). They differ for word kinds: deranging words
of unequal length also shifts every word between them. A draw that changes nothing (rate 0) is the
unperturbed pass itself (no second forward pass; its f/g correlations are 1 by definition).
The random stream of (kind, rate, sample) is ``numpy.random.default_rng([seed, kind_index, round(rate * 1e6),
sample])`` with ``kind_index`` the index in ``KINDS``; the drawn ``order`` and ``position_ids`` are stored too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("token-swap", "token-permute", "word-swap", "word-permute", "posid-swap", "posid-jitter")
WORD_MARKERS = ("Ġ", "▁", " ", "Ċ", "ĉ", "\n", "\t")
JITTER = 4  # largest |offset| of posid-jitter


@dataclass(frozen=True)
class Perturbation:
    order: np.ndarray  # (T,) perturbed position t holds original token order[t]
    position_ids: np.ndarray  # (T,) RoPE position of perturbed position t
    moved_units: float = 0.0  # fraction of the movable units (tokens, or words for word kinds) moved

    @property
    def moved(self) -> float:
        """Fraction of positions 1..T-1 whose token or position id changed."""
        t = np.arange(len(self.order))
        changed = (self.order != t) | (self.position_ids != t)
        return float(changed[1:].mean()) if len(t) > 1 else 0.0

    @property
    def is_identity(self) -> bool:
        t = np.arange(len(self.order))
        return bool((self.order == t).all() and (self.position_ids == t).all())


def _round(x: float) -> int:
    """Round half up (Python's round() rounds half to even)."""
    return int(np.floor(x + 0.5))


def word_starts(tokens: list[str]) -> np.ndarray:
    """(T,) bool: token t begins a word (t = 0 always does)."""
    starts = np.array([t.startswith(WORD_MARKERS) for t in tokens], dtype=bool)
    if len(starts):
        starts[0] = True
    return starts


def _adjacent_pairs(n_units: int, n_pairs: int, rng: np.random.Generator) -> np.ndarray:
    """First indices of ``n_pairs`` non-overlapping adjacent pairs among ``n_units``, uniform over all such sets."""
    n_pairs = min(n_pairs, n_units // 2)
    if n_pairs == 0:
        return np.zeros(0, dtype=np.int64)
    # Stars and bars: sets of n disjoint pairs in m units <-> n-subsets of m - n slots.
    slots = np.sort(rng.choice(n_units - n_pairs, size=n_pairs, replace=False))
    return slots + np.arange(n_pairs)


def _derangement(k: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly drawn permutation of range(k) without fixed points (k >= 2); ~e tries on average."""
    while True:
        perm = rng.permutation(k)
        if (perm != np.arange(k)).all():
            return perm


def _unit_order(kind: str, n_units: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """New order of the movable units 0..n_units-1."""
    perm = np.arange(n_units)
    if kind.endswith("swap"):
        for s in _adjacent_pairs(n_units, _round(rate * n_units / 2), rng):
            perm[s], perm[s + 1] = perm[s + 1], perm[s]
    else:
        k = min(_round(rate * n_units), n_units)
        if k == 1:  # one unit cannot move on its own
            k = 2 if n_units >= 2 else 0
        if k:
            chosen = np.sort(rng.choice(n_units, size=k, replace=False))
            perm[chosen] = chosen[_derangement(k, rng)]
    return perm


def draw_perturbation(
    kind: str,
    rate: float,
    n_tokens: int,
    rng: np.random.Generator,
    starts: np.ndarray | None = None,
    jitter: int = JITTER,
) -> Perturbation:
    """Draw one perturbation of a window of ``n_tokens`` (``starts``: word starts, needed by word kinds)."""
    if kind not in KINDS:
        raise ValueError(f"perturbation kind {kind!r}: expected one of {', '.join(KINDS)}")
    if not 0 <= rate <= 1:
        raise ValueError(f"perturbation rate {rate}: expected a fraction in [0, 1]")
    identity = np.arange(n_tokens)
    order, position_ids = identity.copy(), identity.copy()
    n_movable = n_tokens - 1
    if kind in ("token-swap", "token-permute"):
        units = _unit_order(kind, n_movable, rate, rng)
        order[1:] = 1 + units
    elif kind in ("word-swap", "word-permute"):
        if starts is None or len(starts) != n_tokens:
            raise ValueError(f"{kind}: needs the word starts of all {n_tokens} tokens")
        bounds = np.append(np.flatnonzero(starts), n_tokens)
        words = [identity[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        units = _unit_order(kind, len(words) - 1, rate, rng)
        order = np.concatenate([words[0]] + [words[1 + u] for u in units])
    elif kind == "posid-swap":
        units = _unit_order("swap", n_movable, rate, rng)
        position_ids[1:] = 1 + units
    else:  # posid-jitter
        k = min(_round(rate * n_movable), n_movable)
        chosen = 1 + np.sort(rng.choice(n_movable, size=k, replace=False))
        offset = rng.integers(1, jitter + 1, size=k) * rng.choice(np.array([-1, 1]), size=k)
        position_ids[chosen] = np.maximum(chosen + offset, 0)
        units = np.arange(n_movable)
        units[chosen - 1] = -1  # marks the jittered tokens as moved
    moved_units = float((units != np.arange(len(units))).mean()) if len(units) else 0.0
    return Perturbation(order=order, position_ids=position_ids, moved_units=moved_units)


def rng_for(seed: int, kind: str, rate: float, sample: int) -> np.random.Generator:
    """The random stream of one (kind, rate, sample); independent of the model and variant."""
    return np.random.default_rng([seed, KINDS.index(kind), _round(rate * 1e6), sample])
