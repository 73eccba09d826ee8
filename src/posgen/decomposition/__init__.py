"""Positional + semantic split of attention logits, per (sample, layer, head) (docs/method.md sections 3-5).

Method A (mean-key construction): ``f_ij = s (R_i q_i).(R_j kbar)``, ``g_ij = s (R_D q_i).(R_0 (k_j - kbar))``,
``A = f + g``. ``R_0`` is the identity times the model's ``attention_scaling`` (1 for plain RoPE), so that
``R_D^T R_0 = R_i^T R_(i-D)`` exactly as for a real pair at distance D. Method B: exact least-squares fit
``W_ij ~ a(i-j) + b(i) + c(j)`` over the counted entries.

Every entry counts: nothing is sampled but, where ``decomposition.bound_rows`` asks, the rows of the error of A
and its bound. Method B's fit is iterative, to a relative normal residual of 1e-12. W, f and every g_D are
rank-d matrices (``x_ij = a_i . u_j``), so only the error of A and its bound need every entry. One module per step, in the order
:meth:`Decomposer.unit <posgen.decomposition.decomposer.Decomposer.unit>` runs them:

* ``mask``: the counted entries (causal, windowed, with or without the sink column);
* ``operands``: one (sample, layer) rotated once, the mean keys and the rotations R_D, query heads grouped by
  KV head;
* ``moments``: sums and second moments over the counted entries (float32 products on centred queries plus their
  mean parts in float64, or float64: ``decomposition.precision``), from query-block Gram matrices
  summed over the query blocks that count a key block in full, times the keys, plus the ragged diagonal blocks
  entry by entry (``masked_moments``); dropping the sink column is an O(T) correction (``moments_by_sink``); D
  enters only through the fixed rotation R_D, applied after the sums over tokens;
* ``design``: Method B. The normal matrix depends only on the mask; its products are evaluated from the mask
  structure in O(T), and the fit is solved by conjugate gradients preconditioned with its diagonal (no T x T
  matrix). A head needs only the diagonal sums of its masked W (a cross-correlation along tokens, FFT) and its
  row and column sums (``w_sums``);
* ``bound``: the error of A and the section 5 bound (on the first ``bound_samples`` samples): the mean bound is
  a causal convolution per band (FFT); the error ``W - f - g = [q_rot | p_D] . [R_j (k_j - kbar) | -R_0 (k_j -
  kbar)]`` is one product per cache-sized row block; the bound per entry is one more product times a sign for
  the 'slow' bands (no sign change of ``sin(theta (i-j-D)/2)`` except at i - j = D) and, for the 'fast' ones, a
  product of the query factors with Hankel factors times the key factors;
* ``decomposer``: the steps of one (sample, layer) and the statistics of section 4;
* ``table``: decomposition.nc, unit by unit, and the store path (``decompose_store``);
* ``toeplitz``: Toeplitz and additive variance shares of whole logit matrices (the second paper).
"""

from posgen.decomposition.decomposer import METHODS, Decomposer
from posgen.decomposition.design import LSTSQ_TOL
from posgen.decomposition.mask import SINKS
from posgen.decomposition.options import DecompositionOptions
from posgen.decomposition.table import DecompositionTable, decompose_store
from posgen.decomposition.toeplitz_fit import toeplitz_shares

__all__ = [
    "LSTSQ_TOL",
    "METHODS",
    "SINKS",
    "Decomposer",
    "DecompositionOptions",
    "DecompositionTable",
    "decompose_store",
    "toeplitz_shares",
]
