"""Method B's exact least-squares fit ``W_ij ~ a(i-j) + b(i) + c(j)`` over the counted entries (docs/method.md
section 3B): the right-hand side from the diagonal, row and column sums of W (:func:`w_sums`), and the normal
equations, factorised once per mask (:class:`AdditiveDesign`)."""

from __future__ import annotations

import copy

import torch

from posgen.decomposition.mask import MaskInfo, window_prefix

LSTSQ_TOL = 1e-8  # max relative normal-equation residual of Method B (float64 solves reach ~1e-13)
CG_RTOL = 1e-12  # the conjugate gradients' default target, relative normal residual
CG_MAX_STEPS = 1000  # they take 15-25 steps on the masks tried
CG_STALL = 50  # steps without a better residual after which they stop
CG_ENOUGH = 1e-10  # a residual they reach or the dense solve takes over (narrow windows)
CG_CHECK_EVERY = 5  # the device layout's steps between reads of the residual (each read stalls a GPU)


def w_sums(q: torch.Tensor, k: torch.Tensor, window: int, shift: torch.Tensor):
    """Diagonal (delta = i - j >= 0), row and column sums and column 0 of ``W - shift`` over the counted entries.

    ``W = q k^T`` for ``q (..., T, d)`` and ``k (..., T, d)`` (broadcast: a KV head against its query heads),
    ``shift (...)``; float64, shaped (..., T). No (T x T) matrix: the diagonal sums are a cross-correlation
    along tokens (FFT), rows and columns come from window sums of the factors. Diagonals beyond the window's
    reach sum to 0. The right-hand side of Method B's normal equations, method.md section 3B.
    """
    f64 = torch.float64
    q, k, shift = q.to(f64), k.to(f64), shift.to(f64)[..., None]
    T = q.shape[-2]
    nd = window or T
    tok = torch.arange(T, device=q.device)
    spec = torch.fft.rfft(q.transpose(-1, -2).contiguous(), 2 * T)  # along tokens, per dim
    spec = (spec * torch.fft.rfft(k.transpose(-1, -2).contiguous(), 2 * T).conj()).sum(-2)
    diag = (torch.fft.irfft(spec, 2 * T)[..., :T] - shift * (T - tok)) * (tok < nd)
    rows = (q * window_prefix(k, window, dim=-2)).sum(-1) - shift * (tok + 1).clamp(max=nd)
    # column j is counted by rows j .. j + nd - 1: a window sum of q in reversed token order
    q_after = window_prefix(q.flip(-2), window, dim=-2).flip(-2)
    cols = (q_after * k).sum(-1) - shift * (T - tok).clamp(max=nd)
    col0 = ((q * k[..., :1, :]).sum(-1) - shift) * (tok < nd)
    return diag, rows, cols, col0


class AdditiveDesign:
    """Normal equations ``N theta = X^T w`` of ``W_ij ~ a(i-j) + b(i) + c(j)`` over one mask.

    Unknowns: a_delta (delta = 0 .. n_delta - 1), b_i, c_j. The design has a 3-dim null space (constants
    moved between a, b, c, and the linear trend a + l*delta, b - l*i, c + l*j), which leaves the fit and its
    sums unchanged.

    The causal mask (a window, either sink) is matrix-free: products with N in O(T) from prefix sums, and
    the solve by conjugate gradients preconditioned with N's diagonal (the counts), which converge in 15-25
    steps on the masks tried (300-8192 tokens, windows of 64 or more): no T x T matrix and no factorisation,
    so memory O(T) (method.md section 3B). Where they stall (windows of a few tokens) the mask takes the dense
    solve from then on (:meth:`_factorise`). ``causal=False`` fits the full bidirectional T x T matrix (no window, no sink
    handling; small T): a has one entry per signed distance, stored at index ``delta mod (2T - 1)`` (0 .. T-1,
    then -(T-1) .. -1; ``deltas``), so a_0 stays at index 0; its normal matrix is dense and factorised once, b
    eliminated exactly (its block is diagonal) and a_0 and c at the first and last counted key columns fixed
    to 0.
    """

    def __init__(self, n_tokens: int, window: int, sink: str, device, causal: bool = True, check_every: int = 1):
        T = n_tokens
        if T < 3 or (window and window < 2):
            raise ValueError(f"additive fit needs >= 3 tokens and a window >= 2 (got T={T}, window={window})")
        if not causal and (window or sink != "with"):
            raise ValueError(f"bidirectional additive fit takes no window and sink 'with' (got {window}, {sink!r})")
        f64 = torch.float64
        self.n_tokens, self.window, self.sink, self.causal = T, window, sink, causal
        self.check_every = int(check_every)  # conjugate gradients' steps between reads of the residual
        self.drop = float(sink == "without")  # 1 where key column 0 is dropped; per row in a stack (stack_sinks)
        self.inverse = None  # the dense solve's, once factorised
        self.dense_parts = None  # a stack's (rows, keep, inverse) per design (stack_sinks)
        if causal:
            self.n_delta = window or T
            self.deltas = torch.arange(self.n_delta, device=device)
            tok, nd = torch.arange(T, device=device), self.n_delta
            self.ends = {  # where the products below read the prefix sums
                "tok": tok,
                "nab_t": tok.clamp(max=nd - 1) + 1,  # sum_{delta <= min(i, nd - 1)}
                "nac": T - self.deltas,  # sum_{j <= T - 1 - delta}
                "nac_t": (T - 1 - tok).clamp(max=nd - 1) + 1,  # sum_{delta <= min(T - 1 - j, nd - 1)}
                "m": (tok - nd + 1).clamp(min=0),  # sum_{lo_i <= j}
                "m_t": (tok + nd).clamp(max=T),  # sum_{i <= j + nd - 1}
            }
            ones = torch.ones(T, dtype=f64, device=device)
            self.cnt_a, self.cnt_b, self.cnt_c = self.nab(ones), self.m(ones), self.m_t(ones)  # N's diagonal
        else:
            self._factorise(device)
        self.inv_b = torch.where(self.cnt_b > 0, 1.0 / self.cnt_b.clamp(min=1), torch.zeros_like(self.cnt_b))
        # null space of the design (constants a<->b, b<->c, linear trend), on the counted unknowns
        delta = self.deltas.to(f64)
        tok = torch.arange(T, device=device, dtype=f64)
        zero_a, zero_t, one_a, one_t = (
            torch.zeros_like(delta),
            torch.zeros_like(tok),
            torch.ones_like(delta),
            torch.ones_like(tok),
        )
        null = (
            torch.stack(
                [
                    torch.cat([one_a, -one_t, zero_t]),
                    torch.cat([zero_a, one_t, -one_t]),
                    torch.cat([delta, -tok, tok]),
                ],
                1,
            )
            * (torch.cat([self.cnt_a, self.cnt_b, self.cnt_c]) > 0)[:, None]
        )
        self.null = null
        self.null_proj = torch.linalg.solve(null.T @ null, null.T)  # r -> r - (r null) null_proj

    def _factorise(self, device) -> None:
        """The dense normal matrix, inverted once: always for the bidirectional design, and for a causal one
        whose conjugate gradients stall (a window of a few tokens: N is then as ill-conditioned as a chain's
        Laplacian). b is eliminated exactly (its block is diagonal); a_0 and c at the first and last counted
        key columns are fixed to 0 (the gauge). O(T^2) memory, O(T^3) time."""
        f64, T = torch.float64, self.n_tokens
        if self.causal:
            M = MaskInfo(T, self.window).bool(self.sink, device).to(f64)
        else:
            self.n_delta = 2 * T - 1
            index = torch.arange(self.n_delta, device=device)
            self.deltas = torch.where(index < T, index, index - self.n_delta)  # signed i - j per a index
            M = torch.ones(T, T, dtype=f64, device=device)
        nab = torch.zeros(self.n_delta, T, dtype=f64, device=device)  # [delta, i] = M[i, i - delta]
        nac = torch.zeros(self.n_delta, T, dtype=f64, device=device)  # [delta, j] = M[j + delta, j]
        for index, delta in enumerate(self.deltas.tolist()):
            diag = torch.diagonal(M, -delta)
            nab[index, max(delta, 0) : T + min(delta, 0)] = diag
            nac[index, max(-delta, 0) : T - max(delta, 0)] = diag
        if not self.causal:
            self._dense = (nab, nac, M)  # mask blocks for the products below
        self.cnt_a, self.cnt_b, self.cnt_c = nab.sum(1), M.sum(1), M.sum(0)
        inv_b = torch.where(self.cnt_b > 0, 1.0 / self.cnt_b.clamp(min=1), torch.zeros_like(self.cnt_b))
        # reduced system on z = (a, c) after eliminating b; e[z, i] couples z with b
        e = torch.cat([nab, M.T])
        n_z = self.n_delta + T
        s = torch.zeros(n_z, n_z, dtype=f64, device=device)
        s[: self.n_delta, : self.n_delta] = torch.diag(self.cnt_a)
        s[self.n_delta :, self.n_delta :] = torch.diag(self.cnt_c)
        s[: self.n_delta, self.n_delta :] = nac
        s[self.n_delta :, : self.n_delta] = nac.T
        s -= (e * inv_b) @ e.T
        del e, nab, nac, M
        counted = torch.cat([self.cnt_a, self.cnt_c]) > 0
        cols = torch.nonzero(self.cnt_c > 0).flatten()
        counted[[0, self.n_delta + int(cols[0]), self.n_delta + int(cols[-1])]] = False  # the gauge
        self.keep = torch.nonzero(counted).flatten()
        # an explicit inverse turns every solve into one matrix product; refinement in ``fit`` removes its
        # extra rounding
        chol, info = torch.linalg.cholesky_ex(s[self.keep][:, self.keep])
        if int(info) != 0:
            raise RuntimeError(
                f"additive fit: reduced normal matrix not positive definite (T={T}, window={self.window}, "
                f"sink={self.sink}); the gauge does not match the mask"
            )
        self.inverse = torch.cholesky_inverse(chol)

    def rhs(self, sums):
        """Normal-equation right-hand side (float64) from the diagonal, row and column sums and column 0 of
        the matrix masked for 'with' (:func:`w_sums`).

        For 'without' the key column 0 is taken out of the diagonal, row and column sums. Sums computed along
        different routes disagree at rounding level (sum of diagonals vs rows vs columns); that part, which
        lies in the design's null space and no fit can reach, is projected out, so the reported normal
        residual measures the solve.
        """
        diag, rows, cols, col0 = (t.double() for t in sums)
        ra = diag[:, : self.n_delta]  # bidirectional: every signed diagonal, in the order of ``deltas``
        if self.sink == "without":
            ra = ra - col0[:, : self.n_delta]
            rows = rows - col0
            cols = cols * (self.cnt_c > 0)
        r = torch.cat([ra, rows, cols], -1)
        r = r - (r @ self.null) @ self.null_proj
        return torch.split(r, [self.n_delta, self.n_tokens, self.n_tokens], -1)

    # products with the mask blocks in O(T) from prefix sums (float64), batched over leading dims:
    # nab[delta, i] = M[i, i - delta], nac[delta, j] = M[j + delta, j], M[i, j]. Each takes its operand's
    # prefix sums ``pre`` when the caller has them (``normal`` forms each once for the three products)
    def _prefix(self, v):
        return torch.nn.functional.pad(torch.cumsum(v, -1), (1, 0))  # [k] = sum of v[:k]

    def _at(self, pre, name: str):
        """``pre[..., self.ends[name]]``: a gather, several times faster on a CPU than that indexing."""
        ends = self.ends[name]
        return torch.gather(pre, -1, ends.expand(*pre.shape[:-1], -1))

    def _less_sink(self, out, part):
        """``out`` less ``part()``, key column 0's share, on the rows that drop that column (``drop``)."""
        if isinstance(self.drop, float):
            return out - part() if self.drop else out
        return out - self.drop * part()

    def _no_column0(self, out):
        """``out`` (a new tensor) with key column 0's unknown zeroed on the rows that drop that column."""
        if isinstance(self.drop, float):
            if self.drop:
                out[..., 0] = 0
            return out
        out[..., :1] *= 1 - self.drop
        return out

    def nab(self, b, pre=None):
        if not self.causal:
            return b @ self._dense[0].T
        pre = self._prefix(b) if pre is None else pre
        out = pre[..., -1:] - pre[..., : self.n_delta]  # sum_{i >= delta} b_i
        return self._less_sink(out, lambda: b[..., : self.n_delta])

    def nab_t(self, a, pre=None):
        if not self.causal:
            return a @ self._dense[0]
        pre = self._prefix(a) if pre is None else pre
        out = self._at(pre, "nab_t")  # sum_{delta <= min(i, nd - 1)} a_delta
        return self._less_sink(out, lambda: torch.nn.functional.pad(a, (0, self.n_tokens - self.n_delta)))

    def nac(self, c, pre=None):
        if not self.causal:
            return c @ self._dense[1].T
        pre = self._prefix(c) if pre is None else pre
        out = self._at(pre, "nac")  # sum_{j <= T - 1 - delta} c_j
        return self._less_sink(out, lambda: c[..., :1])

    def nac_t(self, a, pre=None):
        if not self.causal:
            return a @ self._dense[1]
        pre = self._prefix(a) if pre is None else pre
        out = self._at(pre, "nac_t")  # sum_{delta <= min(T - 1 - j, nd - 1)} a_delta
        return self._no_column0(out)  # a gather: out is a new tensor

    def m(self, c, pre=None):
        if not self.causal:
            return c @ self._dense[2].T
        pre = self._prefix(c) if pre is None else pre
        out = pre[..., 1:] - self._at(pre, "m")  # sum_{lo_i <= j <= i} c_j
        return self._less_sink(out, lambda: c[..., :1] * (self.ends["tok"] < self.n_delta))

    def m_t(self, b, pre=None):
        if not self.causal:
            return b @ self._dense[2]
        pre = self._prefix(b) if pre is None else pre
        out = self._at(pre, "m_t") - pre[..., :-1]  # sum_{j <= i <= j + nd - 1} b_i
        return self._no_column0(out)  # a new tensor

    def solve(self, ra, rb, rc, rtol: float = CG_RTOL):
        """Least-squares (a, b, c) for right-hand sides (h, .). Causal: conjugate gradients to the relative
        normal residual ``rtol`` (from 0: the solution of least preconditioned norm); where they stall above
        ``CG_ENOUGH``, the dense solve from then on. Dense: the factorised inverse, gauge entries 0."""
        if self.inverse is None and not self.dense_parts:
            *theta, converged = self._conjugate_gradients(torch.cat([ra, rb, rc], -1), rtol)
            if converged:
                return theta
            self._factorise(ra.device)
        rb_scaled = rb * self.inv_b
        pre = self._prefix(rb_scaled) if self.causal else None  # formed once for both products
        rz = torch.cat([ra - self.nab(rb_scaled, pre), rc - self.m_t(rb_scaled, pre)], -1)
        z = torch.zeros_like(rz)
        start = 0
        for rows, keep, inverse in self.dense_parts or [(len(rz), self.keep, self.inverse)]:
            part = slice(start, start + rows)  # a stack's rows of one design (stack_sinks), or every row
            z[part, keep] = rz[part, keep] @ inverse
            start += rows
        a, c = z[:, : self.n_delta], z[:, self.n_delta :]
        b = (rb - self.nab_t(a) - self.m(c)) * self.inv_b
        return a, b, c

    def _conjugate_gradients(self, r, rtol: float):
        """``N theta = r`` for every row of ``r (h, n_z)``, preconditioned with N's diagonal (the counts; 1 for
        an unknown no entry counts, whose r is 0), from theta = 0. r is projected onto N's range first (the null
        space is the fit's gauge), so the iterates stay there. Stops at the relative residual ``rtol`` or when
        ``CG_STALL`` steps have not improved on the best (rounding's floor, or a stall); returns the best iterate
        and whether its relative residual reached ``rtol``, or at least ``CG_ENOUGH``. The residual is read every
        ``check_every`` steps (1: every step)."""
        split = [self.n_delta, self.n_tokens, self.n_tokens]
        if self.null is not None:  # a stack's rows come projected (stack_sinks)
            r = r - (r @ self.null) @ self.null_proj
        diag = torch.cat([self.cnt_a, self.cnt_b, self.cnt_c], -1).clamp(min=1)  # (n_z,), or (h, n_z) in a stack
        r_norm = torch.linalg.vector_norm(r, dim=-1, keepdim=True).clamp(min=1e-300)  # (h, 1)
        theta = torch.zeros_like(r)
        resid = r.clone()  # r - N theta
        z = resid / diag
        p = z.clone()
        rz = (resid * z).sum(-1, keepdim=True)  # (h, 1)
        best, best_theta, since = float("inf"), theta, 0
        for step in range(CG_MAX_STEPS):
            if step % self.check_every == 0:
                worst = float((torch.linalg.vector_norm(resid, dim=-1, keepdim=True) / r_norm).max())
                if worst < best:
                    best, best_theta, since = worst, theta, 0
                since += self.check_every
                if best <= rtol or since > CG_STALL:
                    break
            n_p = torch.cat(self.normal(*torch.split(p, split, -1)), -1)  # N p
            p_np = torch.linalg.vecdot(p, n_p).unsqueeze(-1)  # (h, 1)
            alpha = rz / torch.where(p_np > 0, p_np, 1.0) * (p_np > 0)  # 0 for a row already solved
            theta = torch.addcmul(theta, alpha, p)  # a new tensor: best_theta may hold the last one
            resid.addcmul_(alpha, n_p, value=-1)
            z = torch.div(resid, diag, out=z)
            rz_next = torch.linalg.vecdot(resid, z).unsqueeze(-1)  # (h, 1)
            p = p.mul_(rz_next / torch.where(rz > 0, rz, 1.0)).add_(z)
            rz = rz_next
        return (*torch.split(best_theta, split, -1), best <= max(rtol, CG_ENOUGH))

    def normal(self, a, b, c):
        """N theta, from the mask structure (independent of the factorisation)."""
        pa, pb, pc = (self._prefix(v) if self.causal else None for v in (a, b, c))  # each formed once
        na = a * self.cnt_a + self.nab(b, pb) + self.nac(c, pc)
        nb = self.nab_t(a, pa) + b * self.cnt_b + self.m(c, pc)
        nc = self.nac_t(a, pa) + self.m_t(b, pb) + c * self.cnt_c
        return na, nb, nc

    def fit(self, ra, rb, rc, tol: float = 0.0, refine: int = 2, theta=None, early_stop: bool = True):
        """Solve and score: (a, b, c), relative normal residual, and sums over the mask (float64).

        Conjugate gradients to ``tol`` (or :data:`CG_RTOL`); the dense solve (bidirectional, or a causal mask
        they stalled on) with up to ``refine`` steps of iterative refinement (residual from the mask structure,
        not the factor) while the residual exceeds ``tol``. The residual reported is that of the returned
        solution. ``theta``, (a, b, c) solved already (:func:`fit_sinks`), skips the solve. ``early_stop=False``
        takes every refinement step without reading the residual back (the device layout).
        ``sum_y = sum(yhat)``, ``sum_yy = sum(yhat^2) = theta.N theta``, ``sum_xy = sum(x yhat) = theta.r``.
        """
        r = torch.cat([ra, rb, rc], -1)
        r_norm = torch.linalg.vector_norm(r, dim=-1).clamp(min=1e-300)
        a, b, c = theta if theta is not None else self.solve(ra, rb, rc, rtol=_cg_rtol(tol))
        dense = self.inverse is not None or self.dense_parts
        refine = refine if dense else 0  # conjugate gradients refine as they go
        for step in range(refine + 1):
            n_theta = torch.cat(self.normal(a, b, c), -1)
            resid = torch.linalg.vector_norm(n_theta - r, dim=-1) / r_norm
            if step == refine or (early_stop and float(resid.max()) <= tol):
                break
            da, db, dc = self.solve(*torch.split(r - n_theta, [self.n_delta, self.n_tokens, self.n_tokens], -1))
            a, b, c = a + da, b + db, c + dc
        theta = torch.cat([a, b, c], -1)
        sums = {
            "sum_y": torch.linalg.vecdot(theta, torch.cat([self.cnt_a, self.cnt_b, self.cnt_c], -1)),
            "sum_yy": (theta * n_theta).sum(-1),
            "sum_xy": (theta * r).sum(-1),
        }
        return (a, b, c), resid, sums


def _cg_rtol(tol: float) -> float:
    """The conjugate gradients' target for a fit to ``tol``: :data:`CG_RTOL`, or ``tol`` where it is smaller."""
    return min(tol, CG_RTOL) if tol else CG_RTOL


def stack_sinks(designs: list[AdditiveDesign], rows: list[int]) -> AdditiveDesign:
    """One causal operator over the stacked right-hand sides of designs of the same mask and other sink
    handlings, ``rows[i]`` rows of ``designs[i]``: its counts and ``drop`` per row, and where every design is
    factorised its dense solve per design's rows (``dense_parts``). The rows come projected
    (:meth:`AdditiveDesign.rhs`), so the stack has no null space of its own."""
    stack = copy.copy(designs[0])
    for name in ("cnt_a", "cnt_b", "cnt_c", "inv_b"):
        setattr(stack, name, torch.cat([getattr(d, name).expand(n, -1) for d, n in zip(designs, rows)]))
    per_row = [
        torch.full((n, 1), d.drop, dtype=stack.cnt_a.dtype, device=stack.cnt_a.device) for d, n in zip(designs, rows)
    ]
    stack.drop = torch.cat(per_row)  # (rows, 1)
    stack.null = stack.null_proj = stack.inverse = None
    if all(d.inverse is not None for d in designs):
        stack.dense_parts = [(n, d.keep, d.inverse) for d, n in zip(designs, rows)]
    return stack


def fit_sinks(designs: dict, rhs: dict, tol: float, early_stop: bool = True) -> tuple:
    """:meth:`AdditiveDesign.fit` of each sink handling's design of one mask, ``{sink: design}`` with
    ``{sink: (ra, rb, rc)}``, as one fit over their stacked rows (:func:`stack_sinks`): half the small
    operations of two. Causal matrix-free designs share one set of conjugate gradients; where those stall (a
    window of a few tokens) each design is factorised (once, cached with the design), as it would have been after
    its own conjugate gradients stalled, and the stack takes each one's dense solve on its rows.
    ``early_stop=False`` (the device layout) takes one refinement step of a dense solve without reading its
    residual: one reaches rounding's floor (relative normal residual 4e-12 -> 4e-14 at 512 tokens, 1.4e-10 ->
    2.6e-13 at 2,048; a second changes nothing).

    Returns ``(a, b, c)``, the residual ``(sink, rows)`` and the sums ``{name: (sink, rows)}``, sinks in the
    order of ``designs``. Causal designs only (a bidirectional one fits on its own: :meth:`AdditiveDesign.fit`)."""
    sinks = list(designs)
    rows = [rhs[sink][0].shape[0] for sink in sinks]
    r = [torch.cat(parts) for parts in zip(*(rhs[sink] for sink in sinks))]  # ra, rb, rc: (rows, .)

    def by_sink(fit):
        theta, resid, sums = fit
        return theta, resid.view(len(sinks), -1), {name: x.view(len(sinks), -1) for name, x in sums.items()}

    if all(d.inverse is None for d in designs.values()):
        stack = stack_sinks([designs[sink] for sink in sinks], rows)
        *theta, converged = stack._conjugate_gradients(torch.cat(r, -1), _cg_rtol(tol))
        if converged:
            return by_sink(stack.fit(*r, tol=tol, theta=theta))
    for design in designs.values():  # where the stack stalls each design would too: the dense solve at once
        if design.inverse is None:
            design._factorise(r[0].device)
    stack = stack_sinks([designs[sink] for sink in sinks], rows)
    return by_sink(stack.fit(*r, tol=tol, refine=2 if early_stop else 1, early_stop=early_stop))
