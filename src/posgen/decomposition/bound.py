"""The bound on Method A's error, entry by entry (docs/method.md section 5, "The bound on Method A's error").

``|W_ij - A_ij| <= s amp^2 sum_l ||q_i^(l)|| ||delta_j^(l)|| |2 sin(theta_l (i - j - D) / 2)|``: the per-band
factor (:class:`BoundTable`), the error of A and its bound over every counted entry (:func:`error_and_bound`),
and the check that the bound holds (:func:`check_bound`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from posgen.decomposition.mask import SINKS
from posgen.decomposition.operands import KEY_SETS, UnitOperands
from posgen.rope import rotate

STATISTICS = ("err_abs_mean", "err_abs_se", "bound_mean", "bound_slack_min")  # error_and_bound's, (H, sink) each
ROW_BLOCK = 32  # the fewest query rows in a tile of the entry pass (_error_pass)
BOUND_RTOL = 1e-4  # bound check: slack may dip below 0 by this times s |q|max |k|max (float32 rounding)
# ... plus the float32 rounding of the rotation angles p theta_l, which the model computes (and so the error E) in
# float32 while the bound's |2 sin(theta_l (i - j - D) / 2)| is exact: at most eps p theta_l per rotated vector
ANGLE_EPS = float(torch.finfo(torch.float32).eps)


def angle_rtol(n_tokens: int, inv_freq) -> float:
    """The rounding of float32 rotation angles in a logit over ``n_tokens`` positions, relative to s |q| |k|:
    each band's two angles p theta_l (p < T) are off by at most u p theta_l (u = eps / 2) before cos/sin, so a
    logit moves by at most |q| |k| u (i + j) theta_max < |q| |k| eps T theta_max (docs/method.md section 5)."""
    if isinstance(inv_freq, np.ndarray):  # a RopeTable's row: read on the host, no device sync
        return ANGLE_EPS * n_tokens * float(inv_freq.max())
    return ANGLE_EPS * n_tokens * torch.as_tensor(inv_freq).max().item()  # torch, any device


def band_norms(x: torch.Tensor) -> torch.Tensor:
    """Per-band norms ``||x^(l)||`` of ``x[..., d]``, bands pairing dims l and l + d/2 (method.md section 5)."""
    half = x.shape[-1] // 2
    return torch.hypot(x[..., :half], x[..., half:])


class BoundTable:
    """The bound's per-band factor ``|2 sin(theta_l (delta - D) / 2)|`` per layer, T, window and D (method.md 5).

    Its sum over the counted entries is a causal convolution along tokens per band (``spectrum``, FFT). Entry by
    entry: 'slow' bands keep ``theta_l (delta - D) / 2`` inside (-pi, pi) for every scored delta, where the
    factor is ``sign(delta - D) * 2 sin(theta_l (i - D) / 2 - theta_l j / 2)``, separable, so all slow bands
    together are one matrix product times a sign; 'fast' bands are summed entry by entry through ``fast_factor``
    (band, delta + T). Angles are formed in float64.
    """

    def __init__(self, inv_freq, n_tokens: int, window: int, dummy_distance: int, device):
        theta = torch.as_tensor(inv_freq).to(device, torch.float64)
        n_delta = window or n_tokens
        reach = max(dummy_distance, abs(n_delta - 1 - dummy_distance))
        slow = (theta * reach < 2 * math.pi).cpu()
        self.slow, self.fast = torch.nonzero(slow).flatten(), torch.nonzero(~slow).flatten()
        th = theta[self.slow.to(device)]
        pos = torch.arange(n_tokens, device=device, dtype=torch.float64)[:, None]
        x, y = th * (pos - dummy_distance) / 2, th * pos / 2
        # U = a * u_trig, V = b * v_trig (bands repeated twice): U.V = sum 2 a b sin(theta (i - j - D) / 2)
        self.u_trig = torch.cat([2 * torch.sin(x), -2 * torch.cos(x)], -1).float()
        self.v_trig = torch.cat([torch.cos(y), torch.sin(y)], -1).float()
        self.n_tokens, self.dummy_distance = n_tokens, dummy_distance
        delta = torch.arange(-n_tokens, n_tokens + 1, device=device, dtype=torch.float64)
        factor = (2 * torch.sin(theta[:, None] * (delta[None] - dummy_distance) / 2)).abs()  # (band, delta + T)
        self.fast_factor = factor[self.fast.to(device)].float().contiguous()
        self.sign = torch.sign(delta - dummy_distance).float()  # [delta + T]
        kernel = factor[:, n_tokens : n_tokens + n_delta]  # scored distances 0 .. n_delta - 1
        self.spectrum = torch.fft.rfft(kernel, 2 * n_tokens, dim=1).T  # (freq, band)

    def slow_factors(self, a: torch.Tensor, b: torch.Tensor):
        """U (.., T, 2 n_slow) from query factors ``a (.., T, L)``, V (.., T, 2 n_slow) from key factors ``b``."""
        slow = self.slow.to(a.device)
        a_s, b_s = a[..., slow].repeat(*([1] * (a.dim() - 1)), 2), b[..., slow].repeat(*([1] * (b.dim() - 1)), 2)
        return a_s * self.u_trig, b_s * self.v_trig

    def sums(self, a: torch.Tensor, b: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Sum of the bound over the counted entries, float64: ``sum_i a_i . (b * factor)_i`` per band.

        ``a (H, T, L)`` query factors, ``b (H_kv, sink, T, L)`` key factors (a zero row drops its column),
        ``kv (H,)`` the KV head of each query head. Returns (H, sink).
        """
        T = self.n_tokens
        spec = torch.fft.rfft(b.double().transpose(-1, -2), 2 * T) * self.spectrum.T  # along tokens, per band
        conv = torch.fft.irfft(spec, 2 * T)[..., :T]  # (H_kv, sink, L, T)
        return torch.einsum("htl,hslt->hs", a.double(), conv[kv])


def error_and_bound(ops: UnitOperands, table: BoundTable, device, block_elems: int, bound_rows: int) -> dict:
    """The error of A and the bound of method.md section 5, entry by entry, per head and sink.

    ``E = W - f - g = [q_rot | p_D] . [R_j (k_j - kbar) | -R_0 (k_j - kbar)]`` and the bound
    ``s sum_l a_il b_jl |2 sin(theta_l (i - j - D) / 2)|`` with ``a = |q^(l)|``, ``b = |k^(l) - kbar^(l)|``
    (0 for a dropped column), with ``table`` the layer's factors (:class:`BoundTable`) and ``block_elems`` the
    size of the row blocks of the one pass over every entry. ``bound_rows`` > 0 (and below T) takes that pass
    over about that many query rows only, in evenly spaced row blocks (:func:`_row_blocks`). Returns (H, sink)
    float64 ``err_abs_mean`` (mean |E|; over the sampled rows, a ratio estimate), ``err_abs_se`` (its standard
    error over the row blocks; 0 when every row is taken), ``bound_mean`` (every entry) and ``bound_slack_min``
    (min of bound - |E| over the entries taken).
    """
    dev, f64 = device, torch.float64
    groups, rope = ops.groups, ops.rope
    T, d = ops.q.shape[1:]
    s, amp = float(rope.scaling), float(rope.attention_scaling)
    used = groups.used
    a_norm = band_norms(ops.q) * (s * amp * amp)  # (H, T, L)
    b_norm = torch.stack([band_norms((ops.k64 - mean[:, None]).float()) for mean in (ops.kbar, ops.kbar_wo)], 1)
    b_norm[:, SINKS.index("without"), 0] = 0  # (H_kv, sink, T, L)
    counts = torch.tensor([ops.counts[sink] for sink in SINKS], device=dev, dtype=f64)  # (sink,)
    *sets, kg = ops.keys[used].split(d, -1)  # (H_kv, T, d) each: the KEY_SETS, then the g set
    kx, kf, kphi = (sets[KEY_SETS.index(name)] for name in ("x", "f", "phi"))
    e_with = torch.cat([kx - kf, -kg], -1)  # (H_kv, T, 2d)
    e_without = torch.cat([kx - kf - kphi, -kg - ops.shift[used, None].float()], -1)  # (H_kv, T, 2d)
    e_keys = torch.stack([e_with, e_without], 1)  # (H_kv, sink, T, 2d)
    e_keys[:, 1, 0] = 0  # 'without' drops column 0
    p_dummy = rotate(ops.q, torch.tensor(ops.dummy_distance), ops.theta, amp) * s  # (H, T, d) s R_D q_i
    err_mean, err_se, slack_min = _error_pass(
        groups.by_kv(torch.cat([ops.q_rot, p_dummy], -1)),  # (H_kv, h, T, 2d)
        e_keys,
        groups.by_kv(a_norm),  # (H_kv, h, T, L)
        b_norm[used],
        table,
        ops.window,
        device,
        block_elems,
        bound_rows,
    )  # (H_kv, h, sink) each
    err_mean, err_se, slack_min = (groups.to_heads(x.permute(2, 0, 1)).T for x in (err_mean, err_se, slack_min))
    return {
        "err_abs_mean": err_mean,  # (H, sink)
        "err_abs_se": err_se,
        "bound_mean": table.sums(a_norm, b_norm, ops.kv) / counts,
        "bound_slack_min": slack_min.double(),
    }


def bound_tolerance(ops: UnitOperands) -> torch.Tensor:
    """How far below 0 the bound's slack may dip, per head, ``(H,)`` float64 on the device: float32 error carries
    rounding of order eps * s |q| |k| sqrt(d), and the float32 rotation angles add :func:`angle_rtol` (linear in
    the window length): ``BOUND_RTOL + angle_rtol`` times ``s |q|max |k|max``."""
    rope = ops.rope
    s, amp = float(rope.scaling), float(rope.attention_scaling)
    q_max = ops.q.norm(dim=-1).amax(-1)  # (H,)
    k_max = ops.k.norm(dim=-1).amax(-1)[ops.kv]  # (H,)
    scale = s * amp * amp * q_max * k_max  # (H,)
    return (BOUND_RTOL + angle_rtol(ops.q.shape[1], rope.inv_freq)) * scale.double()


def check_bound(slack_min: np.ndarray, tol: np.ndarray) -> None:
    """Raises unless the bound of method.md section 5 holds: ``slack_min (H, sink)`` >= -``tol (H,)``
    (:func:`bound_tolerance`), naming the head and sink."""
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64)[:, None], slack_min.shape)
    worst = slack_min + tol
    if (worst < 0).any():
        h_bad, s_bad = np.unravel_index(int(np.argmin(worst / tol)), worst.shape)
        raise RuntimeError(
            f"bound of method.md section 5 violated: head {h_bad}, sink {SINKS[s_bad]}, min(bound - |error|) = "
            f"{slack_min[h_bad, s_bad]:.3g} below the rounding tolerance -{tol[h_bad, 0]:.3g}"
        )


def _row_blocks(n_tokens: int, rows: int, bound_rows: int) -> list[int]:
    """First rows of the row blocks the entry pass takes: all of them, or for ``0 < bound_rows < n_tokens`` about
    ``bound_rows / rows`` blocks (at least 2) evenly spaced from the first to the last (a systematic sample)."""
    starts = list(range(0, n_tokens, rows))
    if not 0 < bound_rows < n_tokens:
        return starts
    k = min(len(starts), max(2, -(-bound_rows // rows)))
    return [starts[i] for i in sorted(set(np.linspace(0, len(starts) - 1, k).round().astype(int).tolist()))]


def _error_pass(e_queries, e_keys, a, b, table: BoundTable, window: int, device, block_elems: int, bound_rows: int):
    """Per query head and sink: the mean of |W - A| over the counted entries of the row blocks taken, its standard
    error over those blocks, and min (bound - |W - A|).

    Per KV head: ``e_queries (n, h, T, 2d)``, ``e_keys (n, sink, T, 2d)``, bound factors ``a (n, h, T, L)`` and
    ``b (n, sink, T, L)``. Returns (n, h, sink) each. The one pass over (T x T) entries, in tiles that keep
    the working set in cache: row blocks of at least ``ROW_BLOCK`` rows, their columns split when the window is
    long (all row blocks, or those of :func:`_row_blocks`; the mean is then the ratio
    estimate sum |E| / entries over the blocks taken, its standard error that of a ratio estimator with the
    finite-population correction). In a block the columns are taken in reverse order, where a Toeplitz
    factor f(i - j) becomes a Hankel view of one stored vector. Slow bands of the bound: one matrix product
    times sign(i - j - D); fast bands: per row, one product of the query factors with the Hankel factors
    times the key factors. Layout (row, head, sink, column). method.md section 5.
    """
    dev = device
    n, h, T, _ = e_queries.shape
    nf, stride = len(table.fast), 2 * T + 1
    fast = table.fast.to(dev)
    block_sums, block_counts = [], []  # per row block taken: (n, h, sink) sums of |E|, (sink,) entries
    slack_min = torch.full((n, h, 2), float("inf"), device=dev)
    u, v = table.slow_factors(a, b)  # (n, h, T, 2 n_slow), (n, sink, T, 2 n_slow)
    # rows first; keys in reversed token order
    q_rows, u_rows = e_queries.transpose(1, 2).contiguous(), u.transpose(1, 2).contiguous()
    a_rows = a[..., fast].transpose(1, 2).contiguous()  # (n, T, h, nf)
    k_rev, v_rev = e_keys.flip(2), v.flip(2)
    b_rev = b[..., fast].flip(2).permute(0, 3, 1, 2).contiguous()  # (n, nf, sink, T)
    # tiles of rows x cols entries, about block_elems each: at least ROW_BLOCK rows, so that long windows split
    # their columns rather than shrink the rows to a few (skinny products, keys streamed from beyond the cache)
    width = 2 * max(h, nf)
    rows = min(T, max(ROW_BLOCK, block_elems // (width * T)))
    cols = max(1, block_elems // (width * rows))
    starts = _row_blocks(T, rows, bound_rows)
    for i0 in starts:
        i1 = min(T, i0 + rows)
        j0 = max(0, i0 - window + 1) if window else 0
        block_counts.append(torch.zeros(2, dtype=torch.float64, device=dev))  # (sink,)
        block_sums.append(torch.zeros(n, h, 2, dtype=torch.float64, device=dev))
        for c0 in range(j0, i1, cols):
            c1 = min(i1, c0 + cols)
            t, w = i1 - i0, c1 - c0
            ii = torch.arange(i0, i1, device=dev)[:, None]
            jj = torch.arange(c1 - 1, c0 - 1, -1, device=dev)[None, :]  # reversed columns
            keep = jj <= ii
            if window:
                keep &= ii - jj < window
            keep = torch.stack([keep, keep & (jj > 0)], 1)[:, None]  # (t, 1, sink, w)
            keep_f, drop = keep.float(), ~keep
            base = i0 - c1 + 1 + T  # [r, u] -> delta + T = base + r + u
            rev = slice(T - c1, T - c0)  # columns c1 - 1 down to c0 in reversed token order
            sign = table.sign.as_strided((t, 1, 1, w), (1, 0, 0, 1), base)
            hank = table.fast_factor.as_strided((t, nf, 1, w), (1, stride, 0, 1), base)
            factors = torch.empty(t, nf, 2, w, device=dev)
            block_counts[-1] += keep_f.sum((0, 1, 3)).double()
            for g in range(n):
                q_block = q_rows[g, i0:i1].view(t * h, -1)  # ((row, head), 2d)
                k_block = k_rev[g, :, rev].reshape(2 * w, -1)  # ((sink, column), 2d)
                err = torch.mm(q_block, k_block.T)  # ((row, head), (sink, column)): W - A
                err = err.view(t, h, 2, w).abs_().mul_(keep_f)  # |W - A|, 0 where not counted
                block_sums[-1][g] += err.sum((0, 3)).double()  # a tile's float32 sum is exact enough
                u_block = u_rows[g, i0:i1].view(t * h, -1)  # ((row, head), 2 n_slow)
                v_block = v_rev[g, :, rev].reshape(2 * w, -1)  # ((sink, column), 2 n_slow)
                bound = torch.mm(u_block, v_block.T)  # ((row, head), (sink, column)): slow bands, unsigned
                bound = bound.view(t, h, 2, w).mul_(sign)
                bound = bound.view(t, h, 2 * w)  # (row, head, (sink, column))
                torch.mul(hank, b_rev[g, :, :, rev], out=factors)  # (row, band, sink, column)
                bound = torch.baddbmm(bound, a_rows[g, i0:i1], factors.view(t, nf, 2 * w))  # plus the fast bands
                bound = bound.view(t, h, 2, w)  # (row, head, sink, column)
                slack = bound.sub_(err).masked_fill_(drop, float("inf"))
                slack_min[g] = torch.minimum(slack_min[g], slack.amin((0, 3)))
    S, N = torch.stack(block_sums), torch.stack(block_counts)[:, None, None]  # (b, n, h, sink), (b, 1, 1, sink)
    mean = S.sum(0) / N.sum(0)  # (n, h, sink)
    k, total = len(starts), -(-T // rows)
    if k == total:
        return mean, torch.zeros_like(mean), slack_min
    spread = ((S - mean * N) ** 2).sum(0) / (k * (k - 1))  # (n, h, sink): the ratio estimator's variance
    se = (spread * (1 - k / total)).sqrt() / N.mean(0)
    return mean, se, slack_min
