"""Every decomposition statistic of one (sample, layer) (docs/method.md sections 3-5).

``Decomposer.unit`` runs the steps in order: ``operands`` (rotations, mean keys; section 1, 3A and 3C),
``moments`` (sums over the counted entries), ``method_b`` (section 3B), ``correlations`` (every method's r from
its sums: Method A, A-drift and A-shared, sections 3A, 3C and 4, and B), ``position_shares`` (section 3C), and
where asked ``error_and_bound`` and ``check_bound`` (section 5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posgen.decomposition.bound import STATISTICS as BOUND_STATISTICS
from posgen.decomposition.bound import BoundTable, bound_tolerance, check_bound, error_and_bound
from posgen.decomposition.design import CG_CHECK_EVERY, LSTSQ_TOL, AdditiveDesign, fit_sinks, w_sums
from posgen.decomposition.drift import (
    BASES,
    SMOOTH_DEGREE,
    drift_basis,
    drift_moments,
    position_basis,
    position_share,
    shared_shares,
)
from posgen.decomposition.mask import SINKS
from posgen.decomposition.moments import MOMENT_NAMES, Moments, band_factors, masked_moments, moments_by_sink
from posgen.decomposition.operands import DRIFT_SET, UnitOperands, unit_operands
from posgen.decomposition.rows import row_moments
from posgen.device import constant, require_full_precision, resolve_device
from posgen.layer_types import used_dummy_distance
from posgen.numerics import DENSE_TOKENS, TOKEN_BLOCK
from posgen.rope_table import LayerRope
from posgen.stats import pearson_from_sums

METHODS = ("A", "B", "A-drift", "A-shared")
SUMS = ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")  # sufficient statistics of r(x = W, y = A, B, ...)
RC_SUMS = ("rc_sum_xx", "rc_sum_yy", "rc_sum_xy")  # ... of the row-centred r (every row's mean is 0)
RC_PACKED = "_rc_sums"  # RC_SUMS as one tensor (name, H, method, sink) on the device, split on the host
RC_SWEEP = "_rc_sweep_sums"  # Method A's row-centred sums over the sweep, made into r_sweep_rc on the host, not kept
VECTORS = ("q", "k")  # position shares of the pre-RoPE query and key
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}  # of the moments' products (masked_moments)


TOL = "_bound_tol"  # the bound's tolerance per head, copied with a unit's statistics and checked, not kept


@dataclass(frozen=True)
class UnitStatistics:
    """One (sample, layer)'s statistics on the analysis device (:meth:`Decomposer.statistics`), before the copy
    to the host and the checks that read them: the bound's tolerance per head (None: no bound), the window."""

    tensors: dict[str, torch.Tensor]
    bound_tol: torch.Tensor | None
    n_tokens: int
    window: int


def to_host(units: list[dict[str, torch.Tensor]]) -> list[dict[str, np.ndarray]]:
    """Every statistic of every unit in one copy to the host (one synchronisation, not one per statistic and
    unit), float64, shaped as on the device."""
    values = [value for unit in units for value in unit.values()]
    flat = torch.cat([value.reshape(-1).to(torch.float64) for value in values])  # (sum of sizes,)
    host = flat.cpu().numpy()
    parts = iter(np.split(host, np.cumsum([value.numel() for value in values])[:-1]))
    return [{name: next(parts).reshape(value.shape) for name, value in unit.items()} for unit in units]


def row_centred_r(host: dict[str, np.ndarray]) -> None:
    """Adds ``r_rc`` (H, method, sink) and ``r_sweep_rc`` (H, sink, D), the row-centred r (docs/method.md section
    4), to a unit's statistics on the host, from its row-centred sums: one division each, not a device operation."""
    host.update(zip(RC_SUMS, host.pop(RC_PACKED)))  # (H, method, sink) each
    sweep = host.pop(RC_SWEEP)  # (H, sink, D, xy | yy)
    xx = host["rc_sum_xx"]  # (H, method, sink)
    with np.errstate(invalid="ignore", divide="ignore"):  # a head without variance: NaN, as the raw r
        host["r_rc"] = host["rc_sum_xy"] / np.sqrt(xx * host["rc_sum_yy"])
        host["r_sweep_rc"] = sweep[..., 0] / np.sqrt(xx[:, :1].transpose(0, 2, 1) * sweep[..., 1])


def _joined(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``parts`` concatenated along ``dim``; a lone part as it is (the device layout's one call)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _columns(a: Moments, drift: Moments, rows: torch.Tensor) -> Moments:
    """Method A's moments (:func:`moments_by_sink`: g terms per dummy distance) and A-drift's and A-shared's
    (:func:`drift_moments`: per pair) as one :class:`Moments` over the columns of the r's, A's f terms (the same
    at every D) repeated, with the row-centring corrections ``rows`` (:func:`row_moments`, already per column):
    ``s_x``, ``s_xx`` ``(sink, n, h)``, ``c_rows`` ``(sink, xy | yy, column + 1, n, h)``, every other ``(sink,
    column, n, h)``."""
    nD = a.s_g.shape[1]

    def f_term(name):
        return torch.cat([getattr(a, name)[:, None].expand(-1, nD, -1, -1), getattr(drift, name)], 1)

    def g_term(name):
        return torch.cat([getattr(a, name), getattr(drift, name)], 1)

    return Moments(
        s_x=a.s_x,
        s_xx=a.s_xx,
        **{name: f_term(name) for name in ("s_f", "s_xf", "s_ff")},
        **{name: g_term(name) for name in ("s_g", "s_xg", "s_fg", "s_gg")},
        c_rows=rows,
    )


class Decomposer:
    """Computes every decomposition statistic of one (sample, layer) at a time; caches per-mask work.

    ``dummy_distances`` is the sweep (method.md section 4), ``dummy_distance`` the D of Method A's r, of r_g
    and of the bound, taken inside the window for a sliding-window layer (:func:`used_dummy_distance`), and so is
    every D of the sweep: min(D, window - 1) on a sliding-window layer. ``block_elems`` sizes the row blocks of the
    pass over every entry for the error of A and the bound (cache-sized on CPU, large on GPU); ``block`` the token
    blocks of :func:`masked_moments`; ``precision`` the dtype of its products (float32: centred, with the mean parts
    in float64; method.md section 4, "Precision"); ``bound_rows`` the query rows of the pass for the error and the
    bound (0: all; method.md section 5).

    ``batched`` (default: on a CUDA device) is the device layout, the same statistics in few large operations and
    no host read inside a layer's analysis but the one copy of its results: every KV head in one
    :func:`masked_moments` call with its loops batched, RoPE's band factors checked once per layer, Method B by
    the mask's factorised normal matrix where it holds at most :data:`DENSE_TOKENS` tokens (else conjugate
    gradients reading their residual every :data:`CG_CHECK_EVERY` steps), and its residual checked on the
    copied results. Off (the CPU's layout), one KV head at a time keeps the working set in cache.
    """

    def __init__(
        self,
        dummy_distances,
        dummy_distance: int,
        device: str = "cpu",
        lstsq_tol: float = LSTSQ_TOL,
        block_elems: int | None = None,
        block: int = TOKEN_BLOCK,
        precision: str = "float32",
        bound_rows: int = 0,
        batched: bool | None = None,
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"decomposition.precision: {precision!r} is not one of {sorted(PRECISIONS)}")
        require_full_precision()
        self.precision = precision
        self.bound_rows = int(bound_rows)
        self.dummy_distances = [int(D) for D in dummy_distances]
        if not self.dummy_distances:
            raise ValueError("decomposition.dummy_distances: empty")
        self.dummy_distance = int(dummy_distance)
        self.device = resolve_device(device)
        self.batched = self.device.type == "cuda" if batched is None else bool(batched)
        self.lstsq_tol = float(lstsq_tol)
        self.block_elems = block_elems or (2**20 if self.device.type == "cpu" else 2**28)
        self.block = int(block)
        self._designs: dict = {}
        self._tables: dict = {}
        self._bases: dict = {}
        self._band_factors: dict = {}
        self.max_residual = 0.0

    @classmethod
    def from_options(cls, options) -> Decomposer:
        """The decomposer of a :class:`posgen.decomposition.options.DecompositionOptions` (its ``bound_samples``
        is the caller's: which windows get the bound)."""
        return cls(
            options.dummy_distances,
            options.dummy_distance,
            device=options.device,
            lstsq_tol=options.lstsq_tol,
            precision=options.precision,
            bound_rows=options.bound_rows,
        )

    def design(self, n_tokens: int, window: int, sink: str) -> AdditiveDesign:
        """Method B's normal equations of one mask (matrix-free; in the device layout factorised once where the
        mask has at most :data:`DENSE_TOKENS` tokens), cached."""
        key = (n_tokens, window, sink)
        if key not in self._designs:
            design = AdditiveDesign(n_tokens, window, sink, self.device, check_every=self._check_every)
            if self.batched and n_tokens <= DENSE_TOKENS:
                design._factorise(self.device)  # one product per solve instead of 15-25 steps of ~70 operations
            self._designs[key] = design
        return self._designs[key]

    @property
    def _check_every(self) -> int:
        return CG_CHECK_EVERY if self.batched else 1

    def band_factors(self, ops: UnitOperands) -> torch.Tensor:
        """RoPE's band factors of ``ops.rotations`` (:func:`band_factors`), computed and checked once per layer's
        RoPE and dummy distances (the check reads a value back to the host)."""
        rope = ops.rope
        key = (np.asarray(rope.inv_freq).tobytes(), float(rope.attention_scaling), tuple(ops.distances))
        if key not in self._band_factors:
            self._band_factors[key] = band_factors(ops.rotations.double())
        return self._band_factors[key]

    def basis(self, n_tokens: int) -> dict[str, torch.Tensor]:
        """The smooth position bases: per sink, those of the position shares (:func:`position_basis`; their first
        columns span the lower degrees, so they serve every basis of :data:`BASES`), and ``"drift"``, that of
        Method A-drift's fit (:func:`drift_basis`); (T, M) each, cached."""
        if n_tokens not in self._bases:
            self._bases[n_tokens] = {
                **{sink: position_basis(n_tokens, SMOOTH_DEGREE, sink, self.device) for sink in SINKS},
                "drift": drift_basis(n_tokens, SMOOTH_DEGREE, self.device),
            }
        return self._bases[n_tokens]

    def table(self, inv_freq, n_tokens: int, window: int, dummy_distance: int) -> BoundTable:
        """The bound's factor table of one layer's ``inv_freq`` (band,), cached."""
        key = (tuple(inv_freq.tolist()), n_tokens, window, dummy_distance)
        if key not in self._tables:
            self._tables[key] = BoundTable(inv_freq, n_tokens, window, dummy_distance, self.device)
        return self._tables[key]

    def layer_distance(self, rope: LayerRope, n_tokens: int) -> int:
        """The dummy distance of Method A's r, r_g and the bound on this layer (:func:`used_dummy_distance`)."""
        return used_dummy_distance(self.dummy_distance, rope.sliding_window, n_tokens)

    def unit(self, q, k, kv_group, rope: LayerRope, with_bound: bool = True, heldout_k=None) -> dict[str, np.ndarray]:
        """All statistics of one (sample, layer): q (H, T, d), k (H_kv, T, d) pre-RoPE; arrays per head, checked.

        ``with_bound=False`` skips the error of A and the section 5 bound, the one pass over every entry (and,
        for the bound, every band); their statistics are then NaN. ``heldout_k`` (H_kv, T, d): the mean key at
        every position over held-out windows, Method A-shared's source (None: its statistics are NaN).
        """
        return self.to_host([self.statistics(q, k, kv_group, rope, with_bound, heldout_k)])[0]

    def statistics(self, q, k, kv_group, rope: LayerRope, with_bound: bool = True, heldout_k=None) -> UnitStatistics:
        """:meth:`unit`'s statistics left on the analysis device and not yet checked; :meth:`to_host` copies and
        checks those of many units at once (a window's layers: one host read per window)."""
        ops = self.operands(q, k, kv_group, rope, heldout_k)
        moments = self.moments(ops)
        b = self.method_b(ops, moments)
        out = {**self.correlations(ops, moments, b), **self.position_shares(ops)}
        if not ops.has_shared:  # no held-out trajectory: no Method A-shared (the stacks above are fresh tensors)
            for name in ("r", "r_f", "r_g", *SUMS):
                out[name][:, METHODS.index("A-shared")] = float("nan")
            out[RC_PACKED][:, :, METHODS.index("A-shared")] = float("nan")
            for name in ("k_shared_share", "k_scaled_share"):
                out[name] = torch.full_like(out[name], float("nan"))
        tol = None
        if with_bound:
            out.update(self.error_and_bound(ops))
            tol = bound_tolerance(ops)
        else:
            H = ops.q.shape[0]
            for name in BOUND_STATISTICS:
                out[name] = torch.full((H, len(SINKS)), float("nan"), dtype=torch.float64, device=ops.q.device)
        return UnitStatistics(out, tol, ops.q.shape[1], ops.window)

    def to_host(self, units: list[UnitStatistics]) -> list[dict[str, np.ndarray]]:
        """The statistics of ``units`` in one copy to the host (float64), then the checks that read them: Method
        B's residual (:meth:`check_residual`) and the bound (:meth:`check_bound`)."""
        tensors = [dict(unit.tensors, **({} if unit.bound_tol is None else {TOL: unit.bound_tol})) for unit in units]
        hosts = to_host(tensors)
        for host in hosts:
            row_centred_r(host)
        for unit, host in zip(units, hosts):
            self.check_residual(host["lstsq_residual"], unit.n_tokens, unit.window)
            if unit.bound_tol is not None:
                self.check_bound(host["bound_slack_min"], host.pop(TOL))
        return hosts

    def operands(self, q, k, kv_group, rope: LayerRope, heldout_k=None) -> UnitOperands:
        """Checks the shapes and rotates once (:func:`unit_operands`)."""
        n_tokens = q.shape[-2]
        return unit_operands(
            q,
            k,
            kv_group,
            rope,
            self.dummy_distance,
            self.dummy_distances,
            self.basis(n_tokens)["drift"],
            self.device,
            heldout_k,
        )

    def moments(self, ops: UnitOperands) -> Moments:
        """Sums and second moments of x = W, f and every g_D over the counted entries, per sink and head, for
        every column of the r's: Method A at each dummy distance of ``ops.distances``, then Method A-drift and
        Method A-shared at the layer's D.

        method.md sections 3A (f, g_D), 3C (A-drift, A-shared) and 4 (with and without the sink column):
        :func:`masked_moments` over the 'with' mask, then :func:`moments_by_sink` and :func:`drift_moments`. No
        (T x T) matrix; on the CPU one KV head at a time keeps the working set small (below malloc's mmap
        threshold). Returns one :class:`Moments`: ``s_x``, ``s_xx`` ``(sink, H)``, every other ``(sink, column,
        H)``.
        """
        groups = ops.groups
        i_dummy = ops.distances.index(ops.dummy_distance)
        # converted to float64 once, not per KV head
        q_kv = groups.by_kv(ops.q_rot).double()  # (H_kv, h, T, d)
        q0_kv = groups.by_kv(ops.q0).double()  # (H_kv, h, T, d)
        rot64 = ops.rotations.double()  # (nD, d, d)
        # A-drift's and A-shared's g at the dummy distance, key sets scored against q0: rows (R_D^T R_0 (k_j -
        # kbar(j)))^T, the two side by side
        g_sets = torch.cat([ops.g_drift @ rot64[i_dummy], ops.g_shared @ rot64[i_dummy]], -1)  # (H_kv, T, 2 d)
        parts = []
        n_kv = len(groups.used)
        step = n_kv if self.batched else 1  # KV heads per call
        w = self.band_factors(ops) if self.batched else None
        for i in range(0, n_kv, step):
            some = groups.used[i : i + step]  # these KV heads
            part = masked_moments(
                q_kv[i : i + step],
                q0_kv[i : i + step],
                rot64,
                ops.keys[some],
                g_sets[some],
                ops.window,
                self.block,
                g_sets=DRIFT_SET,  # A-drift's and A-shared's f sets meet only their own g (q0 sets): no g_D sums
                dtype=PRECISIONS[self.precision],
                batched=self.batched,
                w=w,
            )
            r_shift = ops.shift[some] @ rot64.permute(1, 0, 2).flatten(1)  # (n, (nD, e)): R_D^T shift
            r_shift = r_shift.view(len(some), -1, rot64.shape[-1]).transpose(1, 2)  # (n, d, nD)
            gamma = q0_kv[i : i + step] @ r_shift[:, None]  # (n, h, T, nD)
            gamma = gamma.permute(3, 0, 1, 2)  # (nD, n, h, T)
            a = moments_by_sink(part, gamma, ops.window)  # (sink, [D,] n, h)
            drift = drift_moments(part, DRIFT_SET)  # (sink, [pair,] n, h): A-drift's sets, then A-shared's
            rows = row_moments(part, gamma, ops.window, DRIFT_SET)  # (sink, xy | yy, column + 1, n, h)
            parts.append(_columns(a, drift, rows))
        return Moments(
            **{name: groups.to_heads(_joined([getattr(part, name) for part in parts], -2)) for name in MOMENT_NAMES}
        )

    def correlations(self, ops: UnitOperands, moments: Moments, b: dict) -> dict:
        """Every method's r and sums, and the f and g terms' own r (method.md sections 3A, 3B, 3C and 4), by
        ``pearson_from_sums`` over every column at once: Method A at each dummy distance (the sweep), A-drift,
        A-shared (``moments``, :meth:`moments`) and Method B's fit (``b``, :meth:`method_b`).

        Returns (H, method, sink) arrays ``r``, ``r_f``, ``r_g`` (NaN for Method B, which has no f and g terms),
        ``r_rc`` (row-centred r: :mod:`posgen.decomposition.rows`), :data:`SUMS` of y = f + g_D at the layer's dummy
        distance and :data:`RC_SUMS` (the row-centred sums, for the pooled row-centred r), in :data:`METHODS` order;
        ``r_sweep`` and ``r_sweep_rc`` (H, sink, D), Method A's raw and row-centred r at every dummy distance of the
        sweep.
        """
        m, dev = moments, moments.s_x.device
        nD = len(ops.distances)
        T = ops.q.shape[1]  # a sliding-window layer's sweep at min(D, window - 1) (docs/method.md section 4)
        i_sweep = [ops.distances.index(used_dummy_distance(D, ops.window, T)) for D in self.dummy_distances]
        column = {"A": ops.distances.index(ops.dummy_distance), "A-drift": nD, "A-shared": nD + 1, "B": nD + 2}
        columns = constant([column[method] for method in METHODS], torch.int64, dev)  # (method,)
        n = constant([ops.counts[sink] for sink in SINKS], torch.float64, dev)[:, None, None]  # (sink, 1, 1)
        x, xx = m.s_x[:, None], m.s_xx[:, None]  # (sink, 1, H)
        # y = f + g_D per column, then Method B's fit: (sink, column, H)
        s_y = torch.cat([m.s_f + m.s_g, b["sum_y"][:, None]], 1)
        s_yy = torch.cat([m.s_ff + 2 * m.s_fg + m.s_gg, b["sum_yy"][:, None]], 1)
        s_xy = torch.cat([m.s_xf + m.s_xg, b["sum_xy"][:, None]], 1)
        r = pearson_from_sums(n, x, s_y, xx, s_yy, s_xy)  # (sink, column, H)
        # row-centred: each row less its mean over its scored keys (docs/method.md section 4); Method B's fit has a
        # free row term b(i), so its residual sums to 0 in every row and its row sums are W's: c_xy = c_yy = c_xx,
        # which c_rows holds last at xy and at yy alike (posgen.decomposition.rows.row_moments)
        rc = torch.stack([s_xy, s_yy], 1) - m.c_rows  # (sink, xy | yy, column, H)
        rc_xx = xx - m.c_rows[:, 0, -1:]  # (sink, 1, H)
        # the f and g terms' own r in one pass, then Method B's column (no f and g terms): (sink, column, H) each
        r_fg = pearson_from_sums(
            n, x, torch.stack([m.s_f, m.s_g]), xx, torch.stack([m.s_ff, m.s_gg]), torch.stack([m.s_xf, m.s_xg])
        )  # (f | g, sink, column, H)
        no_term = r.new_full((2, r.shape[0], 1, r.shape[2]), float("nan"))  # (f | g, sink, 1, H)
        r_f, r_g = torch.cat([r_fg, no_term], 2).unbind()
        sums = {"n": n, "sum_x": x, "sum_y": s_y, "sum_xx": xx, "sum_yy": s_yy, "sum_xy": s_xy}
        rc_sums = {"rc_sum_xx": rc_xx, "rc_sum_yy": rc[:, 1], "rc_sum_xy": rc[:, 0]}
        by_method = {"r": r, "r_f": r_f, "r_g": r_g, **sums, **rc_sums}
        stacked = torch.stack([value.expand(r.shape) for value in by_method.values()])  # (name, sink, column, H)
        stacked = stacked.index_select(2, columns).permute(0, 3, 2, 1)  # (name, H, method, sink), a new tensor
        out = dict(zip(list(by_method)[: -len(RC_SUMS)], stacked[: -len(RC_SUMS)].unbind()))
        out[RC_PACKED] = stacked[-len(RC_SUMS) :]  # one copy to the host: split there (row_centred_r)
        sweep = constant(i_sweep, torch.int64, dev)
        out["r_sweep"] = r.index_select(1, sweep).permute(2, 0, 1)  # (H, sink, D)
        out[RC_SWEEP] = rc.index_select(2, sweep).permute(3, 0, 2, 1)  # (H, sink, D, xy | yy): the r's on the host
        out["lstsq_residual"] = b["lstsq_residual"].T  # (H, sink)
        return out

    def position_shares(self, ops: UnitOperands) -> dict[str, torch.Tensor]:
        """The position shares of q and k per head (method.md section 3C): ``<v>_position_share (H, basis, sink)``
        for v in :data:`VECTORS`, each query head carrying its KV head's key share; ``k_shared_share (H, sink)``, the
        part of the key's variance that Method A-shared's s(j) explains, and ``k_scaled_share``, with one fitted
        amplitude of s(j) per window and KV head."""
        smooth = self.basis(ops.q.shape[1])
        bases = torch.stack([smooth[sink] for sink in SINKS])  # (sink, T, M)
        H = ops.q.shape[0]
        shares = position_share(torch.cat([ops.q.double(), ops.k64]), bases)  # (H + H_kv, sink, M): every degree
        degrees = [min(degree, shares.shape[-1] - 1) for degree in BASES.values()]
        shares = shares.index_select(-1, constant(degrees, torch.int64, shares.device))
        shares = shares.transpose(-1, -2)  # (H + H_kv, basis, sink)
        out = {"q_position_share": shares[:H], "k_position_share": shares[H:][ops.kv]}  # (H, basis, sink)
        fixed, scaled = shared_shares(ops.k64, ops.shared)  # (H_kv, sink) each
        out["k_shared_share"] = fixed[ops.kv]
        out["k_scaled_share"] = scaled[ops.kv]
        return out

    def method_b(self, ops: UnitOperands, moments: Moments) -> dict:  # Method A's moments: the sums of W
        """Method B (method.md section 3B): the exact least-squares fit ``W_ij ~ a(i-j) + b(i) + c(j)`` per head
        and sink, its sums with W (section 4), and the relative normal residual of the solve.

        The fit runs on x = W - mean(W) for conditioning (all heads in one solve, from the diagonal, row and column
        sums of :func:`w_sums`); its sums are shifted back to W. Raises if the residual exceeds ``lstsq_tol`` (the
        CPU layout here; the device layout where the statistics reach the host). Returns (sink, H) arrays
        ``sum_y``, ``sum_yy``, ``sum_xy`` and ``lstsq_residual``.
        """
        groups, T = ops.groups, ops.q.shape[1]
        mu_w = moments.s_x[0] / ops.counts["with"]  # (H,) the mean of W
        w_parts = w_sums(
            groups.by_kv(ops.q_rot),  # (H_kv, h, T, d)
            ops.k_rot[groups.used, None],  # (H_kv, 1, T, d)
            ops.window,
            mu_w[groups.order].view(len(groups.used), -1),  # (H_kv, h)
        )
        b_sums = [groups.to_heads(part.permute(2, 0, 1)).T for part in w_parts]  # diag, rows, cols, col0: (H, T)
        designs = {sink: self.design(T, ops.window, sink) for sink in SINKS}
        rhs = {sink: designs[sink].rhs(b_sums) for sink in SINKS}
        _, resid, bs = fit_sinks(designs, rhs, tol=self.lstsq_tol * 1e-3, early_stop=not self.batched)  # (sink, H)
        if not self.batched:
            for sink, worst in zip(SINKS, resid):
                self.check_residual(worst.cpu().numpy(), T, ops.window, sink)
        n = constant([ops.counts[sink] for sink in SINKS], torch.float64, mu_w.device)[:, None]  # (sink, 1)
        # y = yhat + mu_w: sums of y and of x y from those of yhat and x - mu_w, (sink, H)
        return {
            "sum_y": bs["sum_y"] + n * mu_w,
            "sum_yy": bs["sum_yy"] + 2 * mu_w * bs["sum_y"] + n * mu_w * mu_w,
            "sum_xy": bs["sum_xy"] + mu_w * (bs["sum_y"] + moments.s_x),
            "lstsq_residual": resid,
        }

    def check_residual(self, resid: np.ndarray, n_tokens: int, window: int, sink: str = "") -> None:
        """Raises where Method B's relative normal residual ``resid`` is not below ``lstsq_tol``; keeps the worst."""
        worst = float(np.max(resid))
        self.max_residual = max(self.max_residual, worst)
        if not worst < self.lstsq_tol:
            where = f", sink={sink}" if sink else ""
            raise RuntimeError(
                f"additive fit: relative normal residual {worst:.3g} above tolerance "
                f"{self.lstsq_tol:.3g} (T={n_tokens}, window={window}{where})"
            )

    def error_and_bound(self, ops: UnitOperands) -> dict:
        """The error of A and the bound of method.md section 5, entry by entry (:func:`error_and_bound`)."""
        table = self.table(ops.rope.inv_freq, ops.q.shape[1], ops.window, ops.dummy_distance)
        return error_and_bound(ops, table, self.device, self.block_elems, self.bound_rows)

    def check_bound(self, slack_min: np.ndarray, tol: np.ndarray) -> None:
        """Raises unless the bound of method.md section 5 holds (:func:`check_bound`)."""
        check_bound(slack_min, tol)
