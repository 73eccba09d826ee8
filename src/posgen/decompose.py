"""Positional + semantic split of attention logits, per (sample, layer, head) (science.md sections 3-5).

Method A (mean-key construction): ``f_ij = s (R_i q_i).(R_j kbar)``, ``g_ij = s (R_D q_i).(R_0 (k_j - kbar))``,
``A = f + g``. ``R_0`` is the identity times the model's ``attention_scaling`` (1 for plain RoPE), so that
``R_D^T R_0 = R_i^T R_(i-D)`` exactly as for a real pair at distance D. Method B: exact least-squares fit
``W_ij ~ a(i-j) + b(i) + c(j)`` over the counted entries.

Everything is exact (no sampling, no truncated iterations); what keeps it cheap:

* the D sweep: every sum involving g_D comes from ``Z = x @ (k - kbar)`` ((T x T) @ (T x d), once per
  matrix x), prefix sums, and per-block Gram matrices of the key deviations (``masked_square_sums``), so only
  the default D needs a (T x T) g;
* the sink-free variant reuses the sink-inclusive matrices: dropping column 0 is a correction from that
  column, and the sink-free kbar shifts g by a per-row constant (only f needs its own product);
* Method B: the normal matrix depends only on the mask; b is eliminated, the 3-dim gauge fixed, and the
  reduced matrix Cholesky-factorised and inverted once per mask in float64 (cached). A head needs only the
  diagonal, row and column sums of its masked W and one matrix product; the normal residual is then
  evaluated from the mask structure in O(T) (independent of the factor) and refined if needed;
* the section 5 bound, which needs every entry: 'slow' bands (no sign change of ``sin(theta (i-j-D)/2)``
  except at i - j = D) are one matrix product times a sign, 'fast' bands are accumulated in cache-sized row
  blocks; on CUDA one fused Triton kernel does the whole bound and error pass.

Statistics are accumulated in coordinates shifted by each matrix's own mask mean (no float32 cancellation)
and converted to raw float64 sufficient statistics for pooled r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr
from tqdm import tqdm

from posgen.models import resolve_device
from posgen.rope import rotate
from posgen.store import open_dataset, provenance, write_netcdf

SINKS = ("with", "without")
METHODS = ("A", "B")
LSTSQ_TOL = 1e-8  # max relative normal-equation residual of Method B (float64 solves reach ~1e-13)
BOUND_RTOL = 1e-4  # bound check: slack may dip below 0 by this times s |q|max |k|max (float32 rounding)
# attrs of qk.h5 carried into the outputs
CARRIED_ATTRS = ("model", "model_source", "model_revision", "weights_sha256", "variant", "init_seed",
                 "architecture", "capture_point", "softcap", "dtype")


@dataclass(frozen=True)
class LayerRope:
    """RoPE parameters of one layer, as stored in qk.h5."""

    inv_freq: torch.Tensor  # (band,)
    scaling: float
    attention_scaling: float = 1.0
    sliding_window: int = 0  # 0 = global


# ------------------------------------------------------------------------------------------- masks


def effective_window(n_tokens: int, sliding_window: int) -> int:
    """0 for a global layer (or a window that covers the whole sequence), else the window."""
    return int(sliding_window) if 0 < sliding_window < n_tokens else 0


def window_prefix(x: torch.Tensor, window: int, dim: int = 0) -> torch.Tensor:
    """``out_i = sum of x_j over lo_i <= j <= i`` along ``dim``, lo_i = max(0, i - window + 1) (0: all j <= i)."""
    c = torch.cumsum(x, dim)
    n = x.shape[dim]
    if window and window < n:
        lagged = torch.zeros_like(c)
        lagged.narrow(dim, window, n - window).copy_(c.narrow(dim, 0, n - window))
        c = c - lagged
    return c


@dataclass
class MaskInfo:
    """Counts of the entries that count, for both sink handlings (``without`` drops key column 0)."""

    n_tokens: int
    window: int
    row_count: torch.Tensor  # (T,) float64, with the sink
    has_sink: torch.Tensor  # (T,) float64, 1 where entry (i, 0) counts

    @classmethod
    def build(cls, n_tokens: int, window: int, device) -> "MaskInfo":
        i = torch.arange(n_tokens, device=device, dtype=torch.float64)
        lo = (i - window + 1).clamp(min=0) if window else torch.zeros_like(i)
        return cls(n_tokens, window, i - lo + 1, (lo == 0).to(torch.float64))

    def rows(self, sink: str) -> torch.Tensor:
        return self.row_count - self.has_sink if sink == "without" else self.row_count

    def count(self, sink: str) -> float:
        """Number of counted entries (computed on the host: no device round trip)."""
        T, W = self.n_tokens, self.window or self.n_tokens
        n = sum(min(i + 1, W) for i in range(T))
        return float(n - min(T, W) if sink == "without" else n)

    def apply(self, x: torch.Tensor, sink: str = "with") -> torch.Tensor:
        """Zero, in place, the entries of ``x[..., T, T]`` that do not count."""
        x.tril_()
        if self.window:
            x.triu_(-(self.window - 1))
        if sink == "without":
            x[..., 0] = 0
        return x

    def bool(self, sink: str = "with") -> torch.Tensor:
        m = self.apply(torch.ones(self.n_tokens, self.n_tokens, dtype=torch.bool, device=self.row_count.device), sink)
        return m


def matrix_sums(x: torch.Tensor):
    """Diagonal (delta = i - j >= 0), row and column sums and column 0 of masked ``x[..., T, T]``.

    Entries above the diagonal must be 0. The diagonal sums read the reversed flat matrix through a strided
    view: row i' of the view walks the diagonal, and reads that run past column 0 land on zeros (upper
    triangle or padding).
    """
    lead, T = x.shape[:-2], x.shape[-1]
    flat = x.reshape(-1, T * T)
    buf = x.new_empty(flat.shape[0], T * T + T)
    buf[:, T * T:] = 0
    buf[:, : T * T] = flat.flip(-1)
    skew = buf.as_strided((flat.shape[0], T, T), (T * T + T, T + 1, 1))  # [., T-1-i, delta] = x[., i, i-delta]
    diag = skew.sum(1).reshape(*lead, T)
    return diag, x.sum(-1), x.sum(-2), x[..., :, 0]


def masked_square_sums(p: torch.Tensor, dk: torch.Tensor, window: int, block: int = 64) -> torch.Tensor:
    """``sum over counted (i, j) of (p_i . dk_j)^2`` for each of n query sets ``p (n, T, d)``, float64.

    No (T x T) matrix: for a block of rows, key columns that every row of the block counts enter through a
    prefix of per-block Gram matrices (d x d); the rest (the diagonal block and, with a window, its ragged
    start: at most 3 blocks) through one small product, masked.
    """
    n, T, d = p.shape
    dev = p.device
    nb = -(-T // block)
    pad = nb * block - T
    # (nb, n * B, d): one product per block with every query set stacked
    pp = torch.nn.functional.pad(p, (0, 0, 0, pad)).view(n, nb, block, d).transpose(0, 1).reshape(nb, n * block, d)
    kp = torch.nn.functional.pad(dk, (0, 0, 0, pad)).view(nb, block, d)
    kp64 = kp.double()
    gram = torch.cat([kp64.new_zeros(1, d, d), torch.cumsum(kp64.transpose(1, 2) @ kp64, 0)])  # (nb+1, d, d)
    rows = torch.arange(nb * block, device=dev).view(nb, block)
    lo = (rows - window + 1).clamp(min=0) if window else torch.zeros_like(rows)
    # full blocks: from the first block boundary at or after the last row's window start, up to the block
    b_idx = torch.arange(nb, device=dev)
    full_lo = torch.minimum(-(-lo[:, -1] // block), b_idx)
    g_full = (gram[b_idx] - gram[full_lo]).float()
    total = torch.sum((torch.bmm(pp, g_full) * pp).view(nb, n, block, d), (0, 2, 3), dtype=torch.float64)
    # ragged columns: the diagonal block and, with a window, [lo_first, full_lo * B) (< 2 blocks)
    edge = 2 * block if window else 0
    cols = torch.cat([full_lo[:, None] * block - edge + torch.arange(edge, device=dev),
                      b_idx[:, None] * block + torch.arange(block, device=dev)], 1)  # (nb, edge + B)
    valid = (cols[:, None, :] <= rows[:, :, None]) & (cols[:, None, :] >= lo[:, :, None]) & (cols >= 0)[:, None]
    valid[:, :, :edge] &= (cols[:, :edge] < full_lo[:, None] * block)[:, None]
    valid &= (rows < T)[:, :, None]
    kc = torch.nn.functional.pad(dk, (0, 0, 0, pad))[cols.clamp(min=0, max=nb * block - 1)]  # (nb, 3B, d)
    prod = torch.bmm(pp, kc.transpose(-1, -2)).view(nb, n, block, -1)  # (nb, n, B, edge + B)
    return total + torch.sum(prod.square_() * valid[:, None], (0, 2, 3), dtype=torch.float64)


# ------------------------------------------------------------------------------ Method B (additive fit)


class AdditiveDesign:
    """Normal equations of ``W_ij ~ a(i-j) + b(i) + c(j)`` over one mask, factorised once.

    Unknowns: a_delta (delta = 0 .. n_delta - 1), b_i, c_j. The design has a 3-dim null space (constants
    moved between a, b, c, and the linear trend a + l*delta, b - l*i, c + l*j); b is eliminated exactly
    (its block is diagonal) and a_0 and c at the first and last counted key columns are fixed to 0.
    """

    def __init__(self, n_tokens: int, window: int, sink: str, device):
        T = n_tokens
        if T < 3 or (window and window < 2):
            raise ValueError(f"additive fit needs >= 3 tokens and a window >= 2 (got T={T}, window={window})")
        f64 = torch.float64
        info = MaskInfo.build(T, window, device)
        self.has_sink = info.has_sink
        self.n_tokens, self.window, self.sink = T, window, sink
        self.n_delta = window or T
        M = info.bool(sink).to(f64)
        nab = torch.zeros(self.n_delta, T, dtype=f64, device=device)  # [delta, i] = M[i, i - delta]
        nac = torch.zeros(self.n_delta, T, dtype=f64, device=device)  # [delta, j] = M[j + delta, j]
        for delta in range(self.n_delta):
            diag = torch.diagonal(M, -delta)
            nab[delta, delta:] = diag
            nac[delta, : T - delta] = diag
        self.cnt_a, self.cnt_b, self.cnt_c = nab.sum(1), M.sum(1), M.sum(0)
        self.inv_b = torch.where(self.cnt_b > 0, 1.0 / self.cnt_b.clamp(min=1), torch.zeros_like(self.cnt_b))
        # reduced system on z = (a, c) after eliminating b; e[z, i] couples z with b (dense only here)
        e = torch.cat([nab, M.T])
        n_z = self.n_delta + T
        s = torch.zeros(n_z, n_z, dtype=f64, device=device)
        s[: self.n_delta, : self.n_delta] = torch.diag(self.cnt_a)
        s[self.n_delta:, self.n_delta:] = torch.diag(self.cnt_c)
        s[: self.n_delta, self.n_delta:] = nac
        s[self.n_delta:, : self.n_delta] = nac.T
        s -= (e * self.inv_b) @ e.T
        del e, nab, nac, M
        counted = torch.cat([self.cnt_a, self.cnt_c]) > 0
        cols = torch.nonzero(self.cnt_c > 0).flatten()
        # first and last counted key columns: keeps the fitted linear trend, hence theta, small
        gauge = [0, self.n_delta + int(cols[0]), self.n_delta + int(cols[-1])]
        counted[gauge] = False
        self.keep = torch.nonzero(counted).flatten()
        chol, info_ = torch.linalg.cholesky_ex(s[self.keep][:, self.keep])
        if int(info_) != 0:
            raise RuntimeError(f"additive fit: reduced normal matrix not positive definite (T={T}, window={window}, "
                               f"sink={sink}); the gauge does not match the mask")
        # an explicit inverse turns every solve into one matrix product (trsm is slow for few right-hand
        # sides, on GPUs above all); iterative refinement in ``fit`` removes its extra rounding
        self.inverse = torch.cholesky_inverse(chol)
        # null space of the design (constants a<->b, b<->c, linear trend), on the counted unknowns
        delta = torch.arange(self.n_delta, device=device, dtype=f64)
        tok = torch.arange(T, device=device, dtype=f64)
        zero_a, zero_t, one_a, one_t = torch.zeros_like(delta), torch.zeros_like(tok), torch.ones_like(delta), torch.ones_like(tok)
        null = torch.stack([
            torch.cat([one_a, -one_t, zero_t]), torch.cat([zero_a, one_t, -one_t]), torch.cat([delta, -tok, tok]),
        ], 1) * (torch.cat([self.cnt_a, self.cnt_b, self.cnt_c]) > 0)[:, None]
        self.null = null
        self.null_proj = torch.linalg.solve(null.T @ null, null.T)  # r -> r - (r null) null_proj

    def rhs(self, sums):
        """Normal-equation right-hand side (float64) from :func:`matrix_sums` of the matrix masked for 'with'.

        For 'without' the key column 0 is taken out of the diagonal, row and column sums. Sums accumulated
        in float32 disagree at the 1e-7 level (sum of diagonals vs rows vs columns); that part, which lies in
        the design's null space and no fit can reach, is projected out, so the reported normal residual
        measures the solve.
        """
        diag, rows, cols, col0 = (t.double() for t in sums)
        ra = diag[:, : self.n_delta]
        if self.sink == "without":
            ra = ra - col0[:, : self.n_delta]
            rows = rows - col0
            cols = cols * (self.cnt_c > 0)
        r = torch.cat([ra, rows, cols], -1)
        r = r - (r @ self.null) @ self.null_proj
        return torch.split(r, [self.n_delta, self.n_tokens, self.n_tokens], -1)

    # products with the mask blocks in O(T) from prefix sums (float64), batched over leading dims:
    # nab[delta, i] = M[i, i - delta], nac[delta, j] = M[j + delta, j], M[i, j]
    def _prefix(self, v):
        return torch.nn.functional.pad(torch.cumsum(v, -1), (1, 0))  # [k] = sum of v[:k]

    def nab(self, b):
        out = self._prefix(b)[..., -1:] - self._prefix(b)[..., : self.n_delta]  # sum_{i >= delta} b_i
        return out - b[..., : self.n_delta] if self.sink == "without" else out

    def nab_t(self, a):
        T, nd = self.n_tokens, self.n_delta
        idx = torch.arange(T, device=a.device).clamp(max=nd - 1) + 1
        out = self._prefix(a)[..., idx]  # sum_{delta <= min(i, nd - 1)} a_delta
        if self.sink == "without":
            out = out - torch.nn.functional.pad(a, (0, T - nd))
        return out

    def nac(self, c):
        T, nd = self.n_tokens, self.n_delta
        out = self._prefix(c)[..., T - torch.arange(nd, device=c.device)]  # sum_{j <= T - 1 - delta} c_j
        return out - c[..., :1] if self.sink == "without" else out

    def nac_t(self, a):
        T, nd = self.n_tokens, self.n_delta
        idx = (T - 1 - torch.arange(T, device=a.device)).clamp(max=nd - 1) + 1
        out = self._prefix(a)[..., idx]  # sum_{delta <= min(T - 1 - j, nd - 1)} a_delta
        if self.sink == "without":
            out = out.clone()
            out[..., 0] = 0
        return out

    def m(self, c):
        T, nd = self.n_tokens, self.n_delta
        i = torch.arange(T, device=c.device)
        pre = self._prefix(c)
        out = pre[..., i + 1] - pre[..., (i - nd + 1).clamp(min=0)]  # sum_{lo_i <= j <= i} c_j
        if self.sink == "without":
            out = out - c[..., :1] * (i < nd)
        return out

    def m_t(self, b):
        T, nd = self.n_tokens, self.n_delta
        j = torch.arange(T, device=b.device)
        pre = self._prefix(b)
        out = pre[..., (j + nd).clamp(max=T)] - pre[..., j]  # sum_{j <= i <= j + nd - 1} b_i
        if self.sink == "without":
            out = out.clone()
            out[..., 0] = 0
        return out

    def solve(self, ra, rb, rc):
        """Least-squares (a, b, c) for right-hand sides (h, .); gauge entries are 0."""
        rb_scaled = rb * self.inv_b
        rz = torch.cat([ra - self.nab(rb_scaled), rc - self.m_t(rb_scaled)], -1)
        z = torch.zeros_like(rz)
        z[:, self.keep] = rz[:, self.keep] @ self.inverse
        a, c = z[:, : self.n_delta], z[:, self.n_delta:]
        b = (rb - self.nab_t(a) - self.m(c)) * self.inv_b
        return a, b, c

    def normal(self, a, b, c):
        """N theta, from the mask structure (independent of the factorisation)."""
        na = a * self.cnt_a + self.nab(b) + self.nac(c)
        nb = self.nab_t(a) + b * self.cnt_b + self.m(c)
        nc = self.nac_t(a) + self.m_t(b) + c * self.cnt_c
        return na, nb, nc

    def fit(self, ra, rb, rc, tol: float = 0.0, refine: int = 2):
        """Solve and score: (a, b, c), relative normal residual, and sums over the mask (float64).

        Up to ``refine`` steps of iterative refinement (residual from the mask structure, not the factor)
        run while the residual exceeds ``tol``; the residual reported is that of the returned solution.
        ``sum_y = sum(yhat)``, ``sum_yy = sum(yhat^2) = theta.N theta``, ``sum_xy = sum(x yhat) = theta.r``.
        """
        r = torch.cat([ra, rb, rc], -1)
        r_norm = torch.linalg.vector_norm(r, dim=-1).clamp(min=1e-300)
        a, b, c = self.solve(ra, rb, rc)
        for step in range(refine + 1):
            n_theta = torch.cat(self.normal(a, b, c), -1)
            resid = torch.linalg.vector_norm(n_theta - r, dim=-1) / r_norm
            if step == refine or float(resid.max()) <= tol:
                break
            da, db, dc = self.solve(*torch.split(r - n_theta, [self.n_delta, self.n_tokens, self.n_tokens], -1))
            a, b, c = a + da, b + db, c + dc
        theta = torch.cat([a, b, c], -1)
        sums = {
            "sum_y": a @ self.cnt_a + b @ self.cnt_b + c @ self.cnt_c,
            "sum_yy": (theta * n_theta).sum(-1),
            "sum_xy": (theta * r).sum(-1),
        }
        return (a, b, c), resid, sums


# ------------------------------------------------------------------------------------ the bound


def band_norms(x: torch.Tensor) -> torch.Tensor:
    """Per-band norms ``||x^(l)||`` of ``x[..., d]`` in the rotate_half pairing (dims l and l + d/2)."""
    half = x.shape[-1] // 2
    return torch.hypot(x[..., :half], x[..., half:])


class BoundTable:
    """The section 5 bound's per-band factor ``|2 sin(theta_l (delta - D) / 2)|`` for one layer, T, window, D.

    'Slow' bands keep ``theta_l (delta - D) / 2`` inside (-pi, pi) for every scored delta: there the factor is
    ``sign(delta - D) * 2 sin(theta_l (i - D) / 2 - theta_l j / 2)``, separable, so all slow bands together are
    one matrix product times a sign. 'Fast' bands are summed entry by entry, through ``fast`` (band, delta + T).
    Angles are formed in float64.
    """

    def __init__(self, inv_freq: torch.Tensor, n_tokens: int, window: int, dummy: int, device):
        theta = inv_freq.to(device, torch.float64)
        n_delta = window or n_tokens
        reach = max(dummy, abs(n_delta - 1 - dummy))
        slow = (theta * reach < 2 * math.pi).cpu()
        self.slow, self.fast = torch.nonzero(slow).flatten(), torch.nonzero(~slow).flatten()
        th = theta[self.slow.to(device)]
        pos = torch.arange(n_tokens, device=device, dtype=torch.float64)[:, None]
        x, y = th * (pos - dummy) / 2, th * pos / 2
        # U = a * u_trig, V = b * v_trig (bands repeated twice): U.V = sum 2 a b sin(theta (i - j - D) / 2)
        self.u_trig = torch.cat([2 * torch.sin(x), -2 * torch.cos(x)], -1).float()
        self.v_trig = torch.cat([torch.cos(y), torch.sin(y)], -1).float()
        self.n_tokens, self.dummy = n_tokens, dummy
        delta = torch.arange(-n_tokens, n_tokens + 1, device=device, dtype=torch.float64)
        factor = (2 * torch.sin(theta[:, None] * (delta[None] - dummy) / 2)).abs().float()  # (band, delta + T)
        self.factor = factor.contiguous()
        self.fast_factor = factor[self.fast.to(device)].contiguous()
        self.sign = torch.sign(delta - dummy).float()  # [delta + T]

    def slow_factors(self, a: torch.Tensor, b: torch.Tensor):
        """U (.., T, 2 n_slow) from query factors ``a (.., T, L)``, V (.., T, 2 n_slow) from key factors ``b``."""
        slow = self.slow.to(a.device)
        a_s, b_s = a[..., slow].repeat(*([1] * (a.dim() - 1)), 2), b[..., slow].repeat(*([1] * (b.dim() - 1)), 2)
        return a_s * self.u_trig, b_s * self.v_trig


# ---------------------------------------------------------------------------------- one (sample, layer)


def _bdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-head sum of x * y over (T, T), float64 result (BLAS dot on CPU, one pass each)."""
    if x.device.type == "cpu":
        return torch.stack([torch.dot(x[h].reshape(-1), y[h].reshape(-1)) for h in range(x.shape[0])]).double()
    return torch.linalg.vecdot(x.flatten(1), y.flatten(1)).double()


def pearson_from_sums(n, s_x, s_y, s_xx, s_yy, s_xy):
    """Pearson r from sums (raw, or of values shifted by constants); NaN where a variance is not positive.

    Works on torch tensors and numpy arrays alike.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        cxx = s_xx - s_x * s_x / n
        cyy = s_yy - s_y * s_y / n
        cxy = s_xy - s_x * s_y / n
        prod = cxx * cyy
        if torch.is_tensor(prod):
            return torch.where(prod > 0, cxy / torch.sqrt(prod.clamp(min=0)), torch.full_like(prod, float("nan")))
        return np.where(prod > 0, cxy / np.sqrt(np.maximum(prod, 0)), np.nan)


def _raw(n, c_x, c_y, s_x, s_y, s_xx, s_yy, s_xy):
    """Raw sufficient statistics from sums of (x - c_x), (y - c_y)."""
    return {
        "n": torch.full_like(s_x, n),
        "sum_x": s_x + n * c_x,
        "sum_y": s_y + n * c_y,
        "sum_xx": s_xx + 2 * c_x * s_x + n * c_x * c_x,
        "sum_yy": s_yy + 2 * c_y * s_y + n * c_y * c_y,
        "sum_xy": s_xy + c_y * s_x + c_x * s_y + n * c_x * c_y,
    }


class Decomposer:
    """Computes every decomposition statistic of one (sample, layer) at a time; caches per-mask work.

    ``memory`` (bytes) bounds the (T x T) working matrices: heads are processed in chunks that fit.
    ``block_elems`` sizes the row blocks of the bound (cache-sized on CPU, large on GPU).
    """

    def __init__(
        self,
        dummy_distances,
        default_D: int,
        device: str = "cpu",
        lstsq_tol: float = LSTSQ_TOL,
        memory: int | None = None,
        block_elems: int | None = None,
        kernel: str = "auto",
    ):
        self.sweep = [int(D) for D in dummy_distances]
        if not self.sweep:
            raise ValueError("decomposition.dummy_distances: empty")
        self.default_D = int(default_D)
        self.Ds = sorted(set(self.sweep) | {self.default_D})
        self.device = resolve_device(device)
        self.lstsq_tol = float(lstsq_tol)
        self.memory = memory or (2**29 if self.device.type == "cpu" else 2**33)
        self.block_elems = block_elems or (2**20 if self.device.type == "cpu" else 2**28)
        # the bound: a fused Triton kernel on CUDA when available, else torch (the reference)
        if kernel == "auto":
            kernel = "triton" if self.device.type == "cuda" and _triton_kernel() is not None else "torch"
        if kernel not in ("torch", "triton") or (kernel == "triton" and _triton_kernel() is None):
            raise ValueError(f"kernel={kernel!r}: expected 'auto', 'torch' or 'triton' (triton needs CUDA and triton)")
        self.kernel = kernel
        self._designs: dict = {}
        self._tables: dict = {}
        self.max_residual = 0.0

    def design(self, n_tokens: int, window: int, sink: str) -> AdditiveDesign:
        key = (n_tokens, window, sink)
        if key not in self._designs:
            self._designs[key] = AdditiveDesign(n_tokens, window, sink, self.device)
        return self._designs[key]

    def table(self, inv_freq: torch.Tensor, n_tokens: int, window: int) -> BoundTable:
        key = (tuple(inv_freq.tolist()), n_tokens, window)
        if key not in self._tables:
            self._tables[key] = BoundTable(inv_freq, n_tokens, window, self.default_D, self.device)
        return self._tables[key]

    def unit(self, q, k, kv_group, rope: LayerRope, with_bound: bool = True) -> dict[str, np.ndarray]:
        """All statistics of one (sample, layer): q (H, T, d), k (H_kv, T, d) pre-RoPE; arrays per head.

        ``with_bound=False`` skips the section 5 bound (an elementwise pass over every entry and band that
        costs more than everything else on a CPU); its statistics are then NaN.
        """
        dev, f64 = self.device, torch.float64
        q = (q if torch.is_tensor(q) else torch.from_numpy(np.asarray(q))).to(dev, torch.float32)
        k = (k if torch.is_tensor(k) else torch.from_numpy(np.asarray(k))).to(dev, torch.float32)
        kv_np = np.asarray(kv_group, dtype=np.int64)
        kv = torch.as_tensor(kv_np, device=dev)
        H, T, d = q.shape
        if k.shape[1:] != (T, d) or d % 2 or kv_np.shape != (H,) or kv_np.max() >= k.shape[0] or kv_np.min() < 0:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, kv_group {kv_np.shape}: shapes disagree")
        window = effective_window(T, rope.sliding_window)
        s, amp = float(rope.scaling), float(rope.attention_scaling)
        theta = rope.inv_freq.to(dev, torch.float32)
        pos = torch.arange(T, device=dev)
        info = MaskInfo.build(T, window, dev)
        has0 = info.has_sink
        n = {sk: info.count(sk) for sk in SINKS}

        # keys, per KV head: mean key per sink handling, rotated keys / mean keys, deviations seen at position 0
        k64 = k.double()
        kbar = {"with": k64.mean(1), "without": k64[:, 1:].mean(1)}  # (H_kv, d)
        k_rot = rotate(k, pos, theta, amp)
        kbar_rot = {sk: rotate(kbar[sk].float()[:, None].expand(-1, T, -1), pos, theta, amp) for sk in SINKS}
        dk = ((k64 - kbar["with"][:, None]) * amp).float()  # R_0 (k_j - kbar)
        dk64 = dk.double()
        dk_pre = window_prefix(dk64, window, dim=1)  # sum of dk_j over the counted j of row i
        k_pre = window_prefix(k_rot.double(), window, dim=1)
        kb_pre = {sk: window_prefix(kbar_rot[sk].double(), window, dim=1) for sk in SINKS}
        kb_pre["without"] = kb_pre["without"] - has0[:, None] * kbar_rot["without"][:, :1].double()

        # queries: rotated to their own position and to every dummy distance, times s
        q_rot = rotate(q, pos, theta, amp) * s
        p = torch.stack([rotate(q, torch.tensor(D), theta, amp) for D in self.Ds]) * s  # (nD, H, T, d)
        q64, p64 = q_rot.double(), p.double()

        # exact mask means (float64, from prefix sums of the low-rank factors)
        mu_w = (q64 * k_pre[kv]).sum((-1, -2)) / n["with"]
        mu_f = {sk: (q64 * kb_pre[sk][kv]).sum((-1, -2)) / n[sk] for sk in SINKS}

        # everything about g_D that needs no (T, T) matrix: row sums, column 0, the sink shift, sum of squares
        rs_g = (p64 * dk_pre[kv]).sum(-1)  # (nD, H, T) row sums of g_D over the mask
        g0 = (p64 * dk64[kv, :1]).sum(-1) * has0  # g_D[i, 0] where it counts
        c_row = (p64 * ((kbar["with"] - kbar["without"]) * amp)[kv][:, None]).sum(-1)  # g' = g + c_row
        s_gg = torch.zeros(len(self.Ds), H, dtype=f64, device=dev)
        for group in np.unique(kv_np):
            heads = np.flatnonzero(kv_np == group)
            pg = p[:, heads].reshape(-1, T, d)  # (nD * heads, T, d)
            s_gg[:, heads] = masked_square_sums(pg, dk[group], window).view(len(self.Ds), len(heads))

        # the (T, T) matrices, heads in chunks: centred masked x = W - mu_w and f - mu_f (per sink), raw g
        i_def = self.Ds.index(self.default_D)
        mom = {"s_xx": torch.zeros(H, dtype=f64, device=dev)}
        for sk in SINKS:
            mom.update({f"{key}_{sk}": torch.zeros(H, dtype=f64, device=dev) for key in ("s_f", "s_ff", "s_xf")})
        zp = {key: torch.zeros(len(self.Ds), H, dtype=f64, device=dev) for key in ("xg", "fg_with", "fg_without")}
        rs_x = torch.zeros(H, T, dtype=f64, device=dev)
        x0 = torch.zeros(H, T, dtype=f64, device=dev)
        rs_fwo = torch.zeros(H, T, dtype=f64, device=dev)
        err_sum = torch.zeros(H, 2, dtype=f64, device=dev)
        bound_sum = torch.zeros(H, 2, dtype=f64, device=dev)
        slack_min = torch.zeros(H, 2, device=dev)
        a_norm = band_norms(q) * (s * amp * amp)  # (H, T, L) query factors of the bound
        b_norm = torch.stack([band_norms((k64 - kbar[sk][:, None]).float()) for sk in SINKS], 1)  # (H_kv, 2, T, L)
        chunk = max(1, min(H, self.memory // (6 * T * T * 4)))
        b_sums = []
        for h0 in range(0, H, chunk):
            hs = slice(h0, min(H, h0 + chunk))
            kvc = kv[hs]
            x = info.apply(torch.matmul(q_rot[hs], k_rot[kvc].transpose(1, 2)).sub_(mu_w[hs, None, None].float()))
            f = {sk: info.apply(torch.matmul(q_rot[hs], kbar_rot[sk][kvc].transpose(1, 2))
                                .sub_(mu_f[sk][hs, None, None].float()), sk) for sk in SINKS}
            mom["s_xx"][hs] = _bdot(x, x)
            sums = matrix_sums(x)
            b_sums.append(sums)
            rs_x[hs] = sums[1].double()
            x0[hs] = sums[3].double()
            dkc = dk[kvc]
            zp["xg"][:, hs] = (p64[:, hs] * torch.matmul(x, dkc).double()).sum((-1, -2))
            for sk in SINKS:
                mom[f"s_ff_{sk}"][hs] = _bdot(f[sk], f[sk])
                mom[f"s_xf_{sk}"][hs] = _bdot(x, f[sk])
                rs_f = f[sk].sum(-1).double()
                mom[f"s_f_{sk}"][hs] = rs_f.sum(-1)
                zp[f"fg_{sk}"][:, hs] = (p64[:, hs] * torch.matmul(f[sk], dkc).double()).sum((-1, -2))
                if sk == "without":
                    rs_fwo[hs] = rs_f
            g = torch.matmul(p[i_def, hs], dkc.transpose(1, 2))
            consts = ((mu_w[hs] - mu_f["with"][hs]).float(), (mu_w[hs] - mu_f["without"][hs]).float(),
                      c_row[i_def, hs].float())
            if with_bound:
                bound_fn = self._error_and_bound_triton if self.kernel == "triton" else self._error_and_bound
                err_sum[hs], bound_sum[hs], slack_min[hs] = bound_fn(
                    x, f, g, consts, a_norm[hs], b_norm, kv_np[hs], rope, window)
            del x, f, g
        mom["s_x"] = rs_x.sum(-1)

        # moments per sink in shifted coordinates (x - mu_w, f - mu_f[sink], g unshifted);
        # 'without' = 'with' minus column 0, plus the row shift c_row of g
        rows_wo = info.rows("without")
        rs_x_wo = rs_x - x0
        rs_g_wo = rs_g - g0
        m = {
            "with": dict(s_x=mom["s_x"], s_xx=mom["s_xx"], s_f=mom["s_f_with"], s_ff=mom["s_ff_with"],
                         s_xf=mom["s_xf_with"], s_g=rs_g.sum(-1), s_gg=s_gg, s_xg=zp["xg"], s_fg=zp["fg_with"]),
            "without": dict(
                s_x=rs_x_wo.sum(-1), s_xx=mom["s_xx"] - (x0 * x0).sum(-1),
                s_f=mom["s_f_without"], s_ff=mom["s_ff_without"], s_xf=mom["s_xf_without"],
                s_g=rs_g_wo.sum(-1) + (c_row * rows_wo).sum(-1),
                s_gg=s_gg - (g0 * g0).sum(-1) + 2 * (c_row * rs_g_wo).sum(-1) + (c_row * c_row * rows_wo).sum(-1),
                s_xg=zp["xg"] - (x0 * g0).sum(-1) + (c_row * rs_x_wo).sum(-1),
                s_fg=zp["fg_without"] + (c_row * rs_fwo).sum(-1),
            ),
        }

        out = {}
        sweep_idx = [self.Ds.index(D) for D in self.sweep]
        cols = {name: [] for name in ("r_A", "r_B", "r_f", "r_g", "r_sweep", "lstsq_residual")}
        suff = {name: [] for name in ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")}
        for sk in SINKS:
            m_, nn = m[sk], n[sk]
            s_y = m_["s_f"] + m_["s_g"]  # y = f + g_D, shifted by mu_f
            s_yy = m_["s_ff"] + 2 * m_["s_fg"] + m_["s_gg"]
            s_xy = m_["s_xf"] + m_["s_xg"]
            r_all = pearson_from_sums(nn, m_["s_x"], s_y, m_["s_xx"], s_yy, s_xy)  # (nD, H)
            cols["r_sweep"].append(r_all[sweep_idx].T)
            cols["r_A"].append(r_all[i_def])
            cols["r_f"].append(pearson_from_sums(nn, m_["s_x"], m_["s_f"], m_["s_xx"], m_["s_ff"], m_["s_xf"]))
            cols["r_g"].append(pearson_from_sums(nn, m_["s_x"], m_["s_g"][i_def], m_["s_xx"], m_["s_gg"][i_def],
                                        m_["s_xg"][i_def]))
            raw_a = _raw(nn, mu_w, mu_f[sk], m_["s_x"], s_y[i_def], m_["s_xx"], s_yy[i_def], s_xy[i_def])

            # Method B on x = W - mu_w, all heads in one solve
            design = self.design(T, window, sk)
            _, resid, bs = design.fit(*design.rhs([torch.cat(parts) for parts in zip(*b_sums)]),
                                      tol=self.lstsq_tol * 1e-3)
            worst = float(resid.max())
            self.max_residual = max(self.max_residual, worst)
            if not worst < self.lstsq_tol:
                raise RuntimeError(f"additive fit: relative normal residual {worst:.3g} above tolerance "
                                   f"{self.lstsq_tol:.3g} (T={T}, window={window}, sink={sk})")
            cols["lstsq_residual"].append(resid)
            cols["r_B"].append(pearson_from_sums(nn, m_["s_x"], bs["sum_y"], m_["s_xx"], bs["sum_yy"], bs["sum_xy"]))
            raw_b = _raw(nn, mu_w, mu_w, m_["s_x"], bs["sum_y"], m_["s_xx"], bs["sum_yy"], bs["sum_xy"])
            for name in suff:
                suff[name].append(torch.stack([raw_a[name], raw_b[name]], -1))  # (H, method)

        out["r"] = torch.stack([torch.stack([cols["r_A"][i], cols["r_B"][i]], -1) for i in range(2)], -1)
        for name in ("r_f", "r_g", "lstsq_residual"):
            out[name] = torch.stack(cols[name], -1)
        out["r_sweep"] = torch.stack(cols["r_sweep"], 1)
        for name, parts in suff.items():
            out[name] = torch.stack(parts, -1)  # (H, method, sink)
        counts = torch.tensor([n[sk] for sk in SINKS], device=dev, dtype=f64)
        out["err_abs_mean"] = err_sum / counts
        out["bound_mean"] = bound_sum / counts
        out["bound_slack_min"] = slack_min.double()
        if not with_bound:
            for name in ("err_abs_mean", "bound_mean", "bound_slack_min"):
                out[name] = torch.full_like(out[name], float("nan"))
            return {name: value.cpu().numpy().astype(np.float64) for name, value in out.items()}
        # the section 5 bound must hold; float32 logits carry rounding of order eps * s |q| |k| sqrt(d)
        scale = s * amp * amp * q.norm(dim=-1).amax(-1) * k.norm(dim=-1).amax(-1)[kv]  # (H,)
        tol = BOUND_RTOL * scale.double()[:, None]
        worst = out["bound_slack_min"] + tol
        if bool((worst < 0).any()):
            h_bad, s_bad = np.unravel_index(int(torch.argmin(worst / tol)), worst.shape)
            raise RuntimeError(
                f"bound of science.md section 5 violated: head {h_bad}, sink {SINKS[s_bad]}, min(bound - |error|) = "
                f"{float(out['bound_slack_min'][h_bad, s_bad]):.3g} below the rounding tolerance -{float(tol[h_bad, 0]):.3g}")
        return {name: value.cpu().numpy().astype(np.float64) for name, value in out.items()}

    def _error_and_bound(self, x, f, g, consts, a, b, kvc, rope, window):
        """Per head and sink: sum |W - A|, sum of the bound, min (bound - |W - A|) over counted entries.

        Row blocks keep the working set in cache. In a block the columns are taken in reverse order, where a
        Toeplitz factor f(i - j) becomes a Hankel view of one stored vector. Slow bands: one matrix product
        per KV head times sign(i - j - D); fast bands: accumulated band by band. Layout (head, row, sink, col).
        """
        dev = self.device
        h, T, _ = x.shape
        c_with, c_wo, c_row = consts
        table = self.table(rope.inv_freq, T, window)
        nf, stride = len(table.fast), 2 * T + 1
        u, v = table.slow_factors(a, b)  # (h, T, 2ns), (H_kv, 2, T, 2ns)
        fast = table.fast.to(dev)
        groups = []
        for grp in np.unique(kvc):
            heads = np.flatnonzero(kvc == grp)
            contiguous = np.array_equal(heads, np.arange(heads[0], heads[-1] + 1))
            idx = slice(int(heads[0]), int(heads[-1]) + 1) if contiguous else torch.as_tensor(heads, device=dev)
            # band-major, so that every per-band operand is contiguous along tokens; keys in reversed order
            groups.append((idx, u[idx], v[int(grp)].flip(1), a[idx][..., fast].permute(2, 0, 1).contiguous(),
                           b[int(grp)][..., fast].flip(1).permute(2, 0, 1).contiguous()))
        err_sum = torch.zeros(h, 2, dtype=torch.float64, device=dev)
        bound_sum = torch.zeros(h, 2, dtype=torch.float64, device=dev)
        slack_min = torch.full((h, 2), float("inf"), device=dev)
        rows = max(1, min(T, self.block_elems // (2 * T * h)))
        for i0 in range(0, T, rows):
            i1 = min(T, i0 + rows)
            j0 = max(0, i0 - window + 1) if window else 0
            t, w = i1 - i0, i1 - j0
            ii = torch.arange(i0, i1, device=dev)[:, None]
            jj = torch.arange(j0, i1, device=dev)[None, :]
            keep = jj <= ii
            if window:
                keep &= ii - jj < window
            keep = torch.stack([keep, keep & (jj > 0)], 1)  # (t, 2, w)
            base = i0 - i1 + 1 + T  # [r, u] -> delta + T = base + r + u (u: reversed column)
            rev = slice(T - i1, T - j0)  # columns i1 - 1 down to j0 in reversed token order
            sign = table.sign.as_strided((t, 1, w), (1, 0, 1), base)
            bound = torch.empty(h, t, 2, w, device=dev)
            tmp = torch.empty(t, 2, w, device=dev)
            for idx, u_g, v_rev, a_g, b_rev in groups:
                hg = u_g.shape[0]
                acc = torch.mm(u_g[:, i0:i1].reshape(hg * t, -1), v_rev[:, rev].reshape(2 * w, -1).T).view(hg, t, 2, w)
                acc.mul_(sign)
                for band in range(nf):  # one band at a time keeps the block in cache
                    hank = table.fast_factor.as_strided((t, 1, w), (1, 0, 1), base + band * stride)
                    torch.mul(hank, b_rev[band, :, rev], out=tmp)
                    acc.addcmul_(tmp, a_g[band, :, i0:i1, None, None])
                bound[idx] = acc
            bound = bound.flip(-1)
            xg = x[:, i0:i1, j0:i1] - g[:, i0:i1, j0:i1]
            err = torch.empty(h, t, 2, w, device=dev)
            torch.sub(xg, f["with"][:, i0:i1, j0:i1], out=err[:, :, 0]).add_(c_with[:, None, None])
            torch.sub(xg, f["without"][:, i0:i1, j0:i1], out=err[:, :, 1]).sub_(
                c_row[:, i0:i1, None] - c_wo[:, None, None])
            kf = keep.to(err.dtype)
            err.abs_().mul_(kf)
            bound.mul_(kf)
            err_sum += err.sum((1, 3)).double()  # a block's float32 sum is exact enough; blocks add in float64
            bound_sum += bound.sum((1, 3)).double()
            slack = bound.sub_(err).masked_fill_(~keep, float("inf"))
            slack_min = torch.minimum(slack_min, slack.amin((1, 3)))
        return err_sum, bound_sum, slack_min

    def _error_and_bound_triton(self, x, f, g, consts, a, b, kvc, rope, window):
        """Same statistics as :meth:`_error_and_bound`, from one fused kernel pass over (T x T) tiles."""
        dev = self.device
        h, T, _ = x.shape
        L = a.shape[-1]
        c_with, c_wo, c_row = consts
        table = self.table(rope.inv_freq, T, window)
        block = 64
        n_t = -(-T // block)
        out = torch.zeros(h, n_t, n_t, 6, device=dev)
        out[..., 4:] = float("inf")
        kernel = _triton_kernel()
        kernel[(n_t, n_t, h)](
            x, f["with"], f["without"], g, c_with.contiguous(), c_wo.contiguous(), c_row.contiguous(),
            a.contiguous(), b.contiguous(), torch.as_tensor(kvc, device=dev, dtype=torch.int32), table.factor, out,
            T, window, L=L, BI=block, BJ=block, num_warps=4,
        )
        out = out.view(h, -1, 6)
        sums = out[..., :4].sum(1, dtype=torch.float64)
        return sums[:, :2], sums[:, 2:], out[..., 4:].amin(1)


_TRITON = []


def _triton_kernel():
    """The fused bound kernel, or None without CUDA or Triton (compiled on first use)."""
    if _TRITON:
        return _TRITON[0]
    kernel = None
    try:
        if torch.cuda.is_available():
            import triton
            import triton.language as tl

            @triton.jit
            def bound_tiles(X, F0, F1, G, CW, CWO, CROW, A, B, KV, TAB, OUT, T, WINDOW,
                            L: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr):
                pi, pj, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
                i0, j0 = pi * BI, pj * BJ
                skip = j0 > i0 + BI - 1
                if WINDOW > 0:
                    skip = skip | (i0 - (j0 + BJ - 1) >= WINDOW)
                if skip:
                    return
                h64 = h.to(tl.int64)
                offs_i = i0 + tl.arange(0, BI)
                offs_j = j0 + tl.arange(0, BJ)
                ii, jj = offs_i[:, None], offs_j[None, :]
                valid = (ii < T) & (jj <= ii)
                if WINDOW > 0:
                    valid = valid & (ii - jj < WINDOW)
                idx = h64 * T * T + ii.to(tl.int64) * T + jj
                x = tl.load(X + idx, mask=valid, other=0.0)
                f0 = tl.load(F0 + idx, mask=valid, other=0.0)
                f1 = tl.load(F1 + idx, mask=valid, other=0.0)
                g = tl.load(G + idx, mask=valid, other=0.0)
                crow = tl.load(CROW + h64 * T + offs_i, mask=offs_i < T, other=0.0)
                e0 = tl.abs(x - f0 - g + tl.load(CW + h))
                e1 = tl.abs(x - f1 - g - crow[:, None] + tl.load(CWO + h))
                kv = tl.load(KV + h).to(tl.int64)
                dl = tl.where(valid, ii - jj + T, 0)
                acc0 = tl.zeros((BI, BJ), dtype=tl.float32)
                acc1 = tl.zeros((BI, BJ), dtype=tl.float32)
                for band in range(L):
                    a = tl.load(A + (h64 * T + offs_i) * L + band, mask=offs_i < T, other=0.0)
                    b0 = tl.load(B + ((kv * 2) * T + offs_j) * L + band, mask=offs_j < T, other=0.0)
                    b1 = tl.load(B + ((kv * 2 + 1) * T + offs_j) * L + band, mask=offs_j < T, other=0.0)
                    hv = tl.load(TAB + band * (2 * T + 1) + dl, mask=valid, other=0.0)
                    ah = a[:, None] * hv
                    acc0 += ah * b0[None, :]
                    acc1 += ah * b1[None, :]
                valid1 = valid & (jj > 0)
                base = OUT + ((h64 * tl.num_programs(0) + pi) * tl.num_programs(1) + pj) * 6
                tl.store(base + 0, tl.sum(tl.sum(tl.where(valid, e0, 0.0), 1), 0))
                tl.store(base + 1, tl.sum(tl.sum(tl.where(valid1, e1, 0.0), 1), 0))
                tl.store(base + 2, tl.sum(tl.sum(tl.where(valid, acc0, 0.0), 1), 0))
                tl.store(base + 3, tl.sum(tl.sum(tl.where(valid1, acc1, 0.0), 1), 0))
                tl.store(base + 4, tl.min(tl.min(tl.where(valid, acc0 - e0, float("inf")), 1), 0))
                tl.store(base + 5, tl.min(tl.min(tl.where(valid1, acc1 - e1, float("inf")), 1), 0))

            kernel = bound_tiles
    except ImportError:
        kernel = None
    _TRITON.append(kernel)
    return kernel


# ------------------------------------------------------------------------------------------ the store


def layer_rope(ds: xr.Dataset, layer: int) -> LayerRope:
    return LayerRope(
        inv_freq=torch.as_tensor(np.asarray(ds["inv_freq"].isel(layer=layer).values, dtype=np.float32)),
        scaling=float(ds["scaling"].isel(layer=layer)),
        attention_scaling=float(ds["attention_scaling"].isel(layer=layer)),
        sliding_window=int(ds["sliding_window"].isel(layer=layer)),
    )


def _check_store(ds: xr.Dataset, path) -> None:
    need = ["q", "k", "inv_freq", "attention_scaling", "scaling", "sliding_window", "kv_group"]
    missing = [v for v in need if v not in ds]
    if missing:
        raise KeyError(f"{path}: missing variable(s) {', '.join(missing)}")


def decompose_store(
    qk_path,
    out_path,
    *,
    dummy_distances,
    default_D: int,
    device: str = "auto",
    lstsq_tol: float = LSTSQ_TOL,
    bound_samples: int = 0,
    config_hash: str = "",
    progress: bool = True,
) -> xr.Dataset:
    """decomposition.nc from qk.h5, one (sample, layer) at a time (see docs/data-model.md).

    The section 5 bound is evaluated on the first ``bound_samples`` samples (0: all); elsewhere its
    statistics are NaN. Every r statistic covers every sample regardless.
    """
    # without dask: xarray's lazy indexing reads exactly the (sample, layer) slice asked for
    ds = open_dataset(qk_path, lazy=False)
    _check_store(ds, qk_path)
    dec = Decomposer(dummy_distances, default_D, device=device, lstsq_tol=lstsq_tol)
    N, L, H = ds.sizes["sample"], ds.sizes["layer"], ds.sizes["head"]
    kv_group = ds["kv_group"].values
    ropes = [layer_rope(ds, layer) for layer in range(L)]
    arrays: dict[str, np.ndarray] = {}
    units = [(s_, l_) for s_ in range(N) for l_ in range(L)]
    label = f"decompose {ds.attrs.get('model', '')}/{ds.attrs.get('variant', '')}"
    for s_, l_ in tqdm(units, desc=label, unit="layer", disable=not progress):
        q = ds["q"].isel(sample=s_, layer=l_).values
        k = ds["k"].isel(sample=s_, layer=l_).values
        res = dec.unit(q, k, kv_group, ropes[l_], with_bound=not bound_samples or s_ < bound_samples)
        for name, value in res.items():
            if name not in arrays:
                arrays[name] = np.full((N, L) + value.shape, np.nan)
            arrays[name][s_, l_] = value
    coords = {
        "sample": ds["sample"].values, "layer": ds["layer"].values, "head": ds["head"].values,
        "method": list(METHODS), "sink": list(SINKS), "D": np.asarray(dec.sweep, dtype=np.int64),
    }
    base = ("sample", "layer", "head")
    dims = {
        "r": base + ("method", "sink"),
        "r_f": base + ("sink",), "r_g": base + ("sink",),
        "r_sweep": base + ("sink", "D"),
        "err_abs_mean": base + ("sink",), "bound_mean": base + ("sink",), "bound_slack_min": base + ("sink",),
        "lstsq_residual": base + ("sink",),
        **{name: base + ("method", "sink") for name in ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")},
    }
    data = {name: (dims[name], arrays[name]) for name in dims}
    data["r2_f"] = (dims["r_f"], arrays["r_f"] ** 2)
    data["r2_g"] = (dims["r_g"], arrays["r_g"] ** 2)
    carried = {key: ds.attrs[key] for key in CARRIED_ATTRS if key in ds.attrs}
    out = xr.Dataset(data, coords=coords, attrs=provenance(
        config_hash=config_hash, default_D=int(default_D), lstsq_tol=float(lstsq_tol),
        bound_samples=int(min(bound_samples, N) if bound_samples else N),
        lstsq_residual_max=float(dec.max_residual), device=str(dec.device), source=str(qk_path), **carried,
    ))
    ds.close()
    write_netcdf(out, out_path)
    return out
