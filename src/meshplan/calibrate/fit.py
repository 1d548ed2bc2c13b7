"""Least-squares fits of the microbenchmark records: latency α and bandwidth 1/β per collective and mesh dimension,
sustained FLOP/s per GEMM precision, streaming bandwidth per memory-bound kernel. Pure functions of records.

Symbols: t measured seconds, n bytes (comm.py's convention), g group size, f(kind, g) the bus-bandwidth factor,
F FLOP/s, t₀ fixed overhead (launch, synchronisation), BW bytes/s.

    collective   t = α + f(kind, g)·n·β      busbw = 1/β    (NCCL PERFORMANCE.md, "Bus bandwidth": busbw =
                                                            algbw · 2(g−1)/g for all-reduce, (g−1)/g for
                                                            all-gather / reduce-scatter / all-to-all, 1 for p2p)
    GEMM         t = t₀ + 2mnk / F                          (Hockney's r∞ / n½ model of a pipelined unit)
    attention    t = t₀ + 2·b·A·s²·d / F                    (causal forward, the cost model's FLOPs: records.py)
    memory       t = t₀ + bytes / BW                        (STREAM, McCalpin 1995: Copy moves 2 words per
                                                            element, Add 3)
    dispatch     t = t₀ + work / rate                       (one eager PyTorch call on growing tensors: t₀ is
                                                            the host's fixed cost per call, bounded by physics:
                                                            0 < t₀ < 1 ms, ranges.py's host_dispatch)

Every fit is least squares on rows scaled by 1/t, i.e. it minimises the *relative* residuals: timings span
decades of message size and a 1 µs error matters at 4 KiB, not at 1 GiB. Every coefficient is a latency or a
time per byte / FLOP, so none may be negative: the fits are non-negative least squares (Lawson & Hanson 1974,
"Solving Least Squares Problems", ch. 23), solved exactly for these few columns by trying every subset of free
columns (numpy.linalg.lstsq on each) and keeping the best whose coefficients are all ≥ 0. Noise-free points on a
line with non-negative terms are recovered exactly; noisy small sizes no longer give a negative latency (an
unconstrained fit of noisy CPU timings did: issue 38), they give a zero one and say so (``bounded``). R² is
reported on the unscaled times, with the relative residuals (fitted / measured − 1: their RMS and the largest).

α per step: comm.py charges a ring all-reduce 2(g−1) latency steps, all-gather / reduce-scatter / all-to-all
(g−1) and a p2p message one, so the fitted intercept divided by that count is the per-step α that a
hardware preset's ``nvlink_latency`` / ``nic_latency`` holds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from meshplan.calibrate.records import (
    DISPATCH_OPS,
    DIST_KINDS,
    MEMORY_OPS,
    MODULE_OP,
    AttentionSample,
    CollectiveSample,
    DispatchSample,
    GemmSample,
    MemorySample,
)
from meshplan.collectives.comm import BASE_LATENCY_KINDS, SIMPLE_BASE, bus_factor, latency_steps
from meshplan.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class LinearFit:
    """y = intercept + slope·x over ``points`` points, with the coefficient of determination R² and the relative
    residuals; ``bounded``: a coefficient sits at its bound 0 (the unconstrained fit would have made it negative)."""

    intercept: float
    slope: float
    r2: float
    points: int
    residual_rms: float = 0.0  # RMS of fitted / measured − 1
    residual_max: float = 0.0  # largest |fitted / measured − 1|
    bounded: bool = False


@dataclass(frozen=True, kw_only=True)
class NnlsFit:
    """y ≈ Σ coef_j · column_j with every coef_j ≥ 0 (see the module docstring)."""

    coefs: tuple[float, ...]
    r2: float
    residual_rms: float
    residual_max: float
    points: int
    bounded: bool  # some coefficient is held at 0 that the unconstrained fit wanted negative


def nnls(columns: Sequence[npt.ArrayLike], y: npt.ArrayLike, *, relative: bool = True) -> NnlsFit:
    """Non-negative least squares of y on ``columns`` (a few of them), rows weighted by 1/y when ``relative``."""
    a = np.asarray(columns, dtype=float).T
    ys = np.asarray(y, dtype=float)
    if a.ndim != 2 or a.shape[0] != ys.shape[0]:
        raise SpecError(f"fit needs one value per point, got {a.shape[0] if a.ndim == 2 else 0} and {ys.shape[0]}")
    if a.shape[1] > 6:
        raise SpecError(f"nnls solves up to 6 columns by enumeration, got {a.shape[1]}")
    if not np.all(ys > 0):
        raise SpecError(f"fit needs positive times, got min {ys.min()!r}")
    w = 1.0 / ys if relative else np.ones_like(ys)
    aw, yw = a * w[:, None], ys * w
    free, _ = np.linalg.lstsq(aw, yw, rcond=None)[:2]
    best, best_cost = np.zeros(a.shape[1]), float(np.sum(yw ** 2))
    for mask in range(1, 1 << a.shape[1]):
        cols = [j for j in range(a.shape[1]) if mask >> j & 1]
        coef = np.linalg.lstsq(aw[:, cols], yw, rcond=None)[0]
        if np.any(coef < 0):
            continue
        full = np.zeros(a.shape[1])
        full[cols] = coef
        cost = float(np.sum((aw @ full - yw) ** 2))
        if cost < best_cost * (1 - 1e-12):
            best, best_cost = full, cost
    fitted = a @ best
    residual = float(np.sum((ys - fitted) ** 2))
    total = float(np.sum((ys - ys.mean()) ** 2))
    rel = fitted / ys - 1.0
    r2 = 1.0 - residual / total if total > 0 else float(residual == 0)
    return NnlsFit(coefs=tuple(float(c) for c in best), r2=r2,
                   residual_rms=float(np.sqrt(np.mean(rel ** 2))), residual_max=float(np.max(np.abs(rel))),
                   points=len(ys), bounded=bool(np.any(free < 0) and np.any(best == 0)))


def linear_fit(x: Sequence[float], y: Sequence[float], *, relative: bool = True) -> LinearFit:
    """Least squares of y = a + b·x with a, b ≥ 0; rows weighted by 1/y when ``relative`` (module docstring)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise SpecError(f"fit needs x and y of one length, got {xs.shape} and {ys.shape}")
    if len(np.unique(xs)) < 2:
        raise SpecError(f"fit needs at least two distinct sizes, got {sorted(set(xs.tolist()))}")
    fit = nnls([np.ones_like(xs), xs], ys, relative=relative)
    return LinearFit(intercept=fit.coefs[0], slope=fit.coefs[1], r2=fit.r2, points=fit.points,
                     residual_rms=fit.residual_rms, residual_max=fit.residual_max, bounded=fit.bounded)


# ---- collectives ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LinkFit:
    """t = latency + f·n / bandwidth for one collective along one mesh dimension."""

    kind: str
    dim: int
    group: int
    latency: float  # the intercept: seconds for an empty message
    bandwidth: float  # bus bandwidth, bytes/s per rank per direction
    step_latency: float  # latency / latency_steps(kind, group): comm.py's α
    r2: float
    points: int
    bound: bool = False  # True: the fit's slope was not positive, bandwidth is the best observed busbw
    residual_rms: float = 0.0  # relative residuals of the fit (LinearFit)
    residual_max: float = 0.0


def fit_collective(samples: Sequence[CollectiveSample]) -> LinkFit:
    """Fit one (kind, dim) series: x = f(kind, g)·n, y = t; busbw = 1/slope, α = intercept."""
    kind, dim, group = samples[0].kind, samples[0].dim, samples[0].group
    if any((s.kind, s.dim, s.group) != (kind, dim, group) for s in samples):
        raise SpecError("fit_collective needs samples of one kind, dimension and group size")
    factor = bus_factor(kind, group)
    x = [factor * s.nbytes for s in samples]
    y = [s.seconds for s in samples]
    fit = linear_fit(x, y)
    latency = max(fit.intercept, 0.0)
    if fit.slope > 0:
        bandwidth, bound = 1.0 / fit.slope, False
    else:  # latency-bound sizes only: the highest bus bandwidth seen is a lower bound
        bandwidth, bound = max(xi / yi for xi, yi in zip(x, y, strict=True)), True
    # beyond the innermost dimension comm.py adds NCCL's base latency per call to what α × steps gives
    # (comm.base_latency): the per-step α is what the intercept leaves of it
    base = SIMPLE_BASE if dim > 0 and kind in BASE_LATENCY_KINDS else 0.0
    return LinkFit(kind=kind, dim=dim, group=group, latency=latency, bandwidth=bandwidth,
                   step_latency=max(latency - base, 0.0) / latency_steps(kind, group), r2=fit.r2, points=fit.points,
                   bound=bound,
                   residual_rms=fit.residual_rms, residual_max=fit.residual_max)


def fit_collectives(samples: Iterable[CollectiveSample]) -> tuple[LinkFit, ...]:
    """One LinkFit per (dimension, kind), in dimension order then DIST_KINDS order."""
    series: dict[tuple[int, str], list[CollectiveSample]] = {}
    for s in samples:
        series.setdefault((s.dim, s.kind), []).append(s)
    order = {k: i for i, k in enumerate(DIST_KINDS)}
    keys = sorted(series, key=lambda key: (key[0], order.get(key[1], len(order)), key[1]))
    return tuple(fit_collective(series[key]) for key in keys)


@dataclass(frozen=True, kw_only=True)
class TierFit:
    """One mesh dimension summarised over its collectives: the median bus bandwidth and per-step α."""

    dim: int
    group: int
    bandwidth: float
    latency: float
    kinds: tuple[str, ...]


def summarize_dims(links: Iterable[LinkFit]) -> tuple[TierFit, ...]:
    """Median over the collectives measured on each dimension. NCCL's bus bandwidth is defined so that it is
    the same link figure whatever the collective (PERFORMANCE.md); the median damps a collective that the
    backend implements poorly."""
    by_dim: dict[int, list[LinkFit]] = {}
    for link in links:
        by_dim.setdefault(link.dim, []).append(link)
    return tuple(TierFit(dim=d, group=fits[0].group, bandwidth=statistics.median(f.bandwidth for f in fits),
                         latency=statistics.median(f.step_latency for f in fits), kinds=tuple(f.kind for f in fits))
                 for d, fits in sorted(by_dim.items()))


# ---- GEMMs ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class GemmFit:
    """Sustained GEMM rate of one precision: the fit's asymptotic F and t₀, and the best shape measured."""

    precision: str
    rate: float  # F, FLOP/s (1/slope of t against 2mnk)
    overhead: float  # t₀, seconds
    best: float  # highest achieved 2mnk / t over the shapes: the "maximum achievable matmul FLOPS"
    best_shape: tuple[int, int, int]
    peak: float  # dense datasheet FLOP/s if known, else 0
    shapes: tuple[tuple[int, int, int, float], ...]  # (m, n, k, achieved FLOP/s) per shape
    r2: float
    points: int
    residual_rms: float = 0.0  # relative residuals of t = t₀ + 2mnk / F over the shapes
    residual_max: float = 0.0

    @property
    def efficiency(self) -> float:
        """best / peak (0 without a peak): the preset's ``matmul_bf16`` when precision is bf16."""
        return self.best / self.peak if self.peak > 0 else 0.0

    def shape_efficiency(self) -> tuple[tuple[int, int, int, float], ...]:
        """(m, n, k, achieved / peak) per shape; achieved / best when no peak is known."""
        basis = self.peak if self.peak > 0 else self.best
        return tuple((m, n, k, rate / basis) for m, n, k, rate in self.shapes)


def fit_gemm(samples: Iterable[GemmSample], peaks: Mapping[str, float] | None = None) -> tuple[GemmFit, ...]:
    """One GemmFit per precision (t = t₀ + 2mnk / F); ``peaks`` (precision → dense FLOP/s) for efficiencies."""
    series: dict[str, list[GemmSample]] = {}
    for s in samples:
        series.setdefault(s.precision, []).append(s)
    fits = []
    for precision, points in series.items():
        fit = linear_fit([s.flops for s in points], [s.seconds for s in points])
        shapes = tuple((s.m, s.n, s.k, s.flops / s.seconds) for s in points)
        best = max(shapes, key=lambda row: row[3])
        rate = 1.0 / fit.slope if fit.slope > 0 else best[3]
        fits.append(GemmFit(precision=precision, rate=rate, overhead=fit.intercept, best=best[3],
                            best_shape=best[:3], peak=float((peaks or {}).get(precision, 0.0)), shapes=shapes,
                            r2=fit.r2, points=fit.points, residual_rms=fit.residual_rms,
                            residual_max=fit.residual_max))
    return tuple(fits)


# ---- attention --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttentionFit:
    """Sustained causal attention forward rate: t = t₀ + FLOPs / F over the shapes (FLOPs: records.AttentionSample)."""

    precision: str
    rate: float  # F, FLOP/s (1/slope)
    overhead: float  # t₀, seconds
    best: float  # highest achieved FLOPs / t over the shapes
    best_shape: tuple[int, int, int, int]  # (batch, heads, seq, head_dim)
    shapes: tuple[tuple[int, int, int, int, float], ...]  # (batch, heads, seq, head_dim, achieved FLOP/s)
    r2: float
    points: int
    residual_rms: float = 0.0
    residual_max: float = 0.0


def fit_attention(samples: Sequence[AttentionSample]) -> AttentionFit | None:
    """The fit t = t₀ + FLOPs / F over every attention sample (one precision), as fit_gemm; None without samples."""
    if not samples:
        return None
    if len({s.precision for s in samples}) > 1:
        raise SpecError(f"fit_attention needs one precision, got {sorted({s.precision for s in samples})}")
    fit = linear_fit([s.flops for s in samples], [s.seconds for s in samples])
    shapes = tuple((s.batch, s.heads, s.seq, s.head_dim, s.flops / s.seconds) for s in samples)
    best = max(shapes, key=lambda row: row[4])
    return AttentionFit(precision=samples[0].precision, rate=1.0 / fit.slope if fit.slope > 0 else best[4],
                        overhead=fit.intercept, best=best[4], best_shape=best[:4], shapes=shapes, r2=fit.r2,
                        points=fit.points, residual_rms=fit.residual_rms, residual_max=fit.residual_max)


# ---- memory-bound kernels ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MemoryFit:
    """Streaming bandwidth of one memory-bound kernel: t = t₀ + bytes / BW."""

    op: str
    bandwidth: float  # BW, bytes/s (1/slope)
    overhead: float  # t₀, seconds
    best: float  # highest achieved bytes / t
    r2: float
    points: int
    residual_rms: float = 0.0  # relative residuals of t = t₀ + bytes / BW
    residual_max: float = 0.0


def fit_memory(samples: Iterable[MemorySample]) -> tuple[MemoryFit, ...]:
    """One MemoryFit per op, in MEMORY_OPS order."""
    series: dict[str, list[MemorySample]] = {}
    for s in samples:
        series.setdefault(s.op, []).append(s)
    order = {k: i for i, k in enumerate(MEMORY_OPS)}
    fits = []
    for op in sorted(series, key=lambda o: (order.get(o, len(order)), o)):
        points = series[op]
        fit = linear_fit([s.nbytes for s in points], [s.seconds for s in points])
        best = max(s.nbytes / s.seconds for s in points)
        fits.append(MemoryFit(op=op, bandwidth=1.0 / fit.slope if fit.slope > 0 else best, overhead=fit.intercept,
                              best=best, r2=fit.r2, points=fit.points, residual_rms=fit.residual_rms,
                              residual_max=fit.residual_max))
    return tuple(fits)


# ---- host dispatch ----------------------------------------------------------------------------------------
# 1 ms per measured call, 10x the slowest call reported (te.Linear on GB200, 99.7 us: TransformerEngine #2053):
# beyond it the run was preempted, not dispatching (a stack file may set more: ranges.py allows 10 ms)
MAX_DISPATCH = 1e-3


@dataclass(frozen=True, kw_only=True)
class DispatchFit:
    """One eager call's host cost: t = t₀ + work / rate over growing tensors; ``problem`` says why t₀ is refused
    (empty: 0 < t₀ < MAX_DISPATCH). R² is reported, not a gate: the sizes are chosen so that the work is small, and
    a flat series (R² near 0) is the expected, host-bound answer."""

    op: str
    overhead: float  # t₀, seconds per call
    rate: float  # work per second (1/slope; 0: the slope held at 0, no work term measured)
    r2: float
    points: int
    residual_rms: float = 0.0
    residual_max: float = 0.0
    problem: str = ""


def dispatch_problem(op: str, t0: float) -> str:
    """Why ``t0`` is no host cost per call, in one line (empty when it is one)."""
    if not 0 < t0 < MAX_DISPATCH:
        why = ("held at 0 by the non-negative fit: no fixed cost per call measured, which no host has" if t0 <= 0
               else "a call that slow is a preempted or throttled run, not dispatch")
        return (f"{op} dispatch fit t0={t0 * 1e6:.4g} us is outside 0 … {MAX_DISPATCH * 1e6:g} us ({why}); "
                "measure again on a quieter host")
    return ""


def fit_dispatch(samples: Iterable[DispatchSample]) -> tuple[DispatchFit, ...]:
    """One DispatchFit per op (DISPATCH_OPS order, then the module call); an op timed at one size only is fitted
    as t₀ = its time (no work term)."""
    series: dict[str, list[DispatchSample]] = {}
    for s in samples:
        series.setdefault(s.op, []).append(s)
    order = {k: i for i, k in enumerate((*DISPATCH_OPS, MODULE_OP))}
    fits = []
    for op in sorted(series, key=lambda o: (order.get(o, len(order)), o)):
        points = series[op]
        if len({s.work for s in points}) < 2:
            t0 = statistics.median(s.seconds for s in points)
            fits.append(DispatchFit(op=op, overhead=t0, rate=0.0, r2=0.0, points=len(points),
                                    problem=dispatch_problem(op, t0)))
            continue
        fit = linear_fit([s.work for s in points], [s.seconds for s in points])
        fits.append(DispatchFit(op=op, overhead=fit.intercept, rate=1.0 / fit.slope if fit.slope > 0 else 0.0,
                                r2=fit.r2, points=fit.points, residual_rms=fit.residual_rms,
                                residual_max=fit.residual_max, problem=dispatch_problem(op, fit.intercept)))
    return tuple(fits)


@dataclass(frozen=True, kw_only=True)
class HostDispatch:
    """What a stack's ``host_dispatch`` is set to: the median t₀ of the bare aten ops (each launches one kernel),
    and the nn.Module call's own cost on top of its op (t₀ of the module call − t₀ of F.linear, ≥ 0)."""

    seconds: float
    module: float
    ops: tuple[str, ...]


def host_dispatch(fits: Sequence[DispatchFit]) -> HostDispatch:
    """The host cost per launched kernel from the dispatch fits; a refused fit (``problem``) is one SpecError line."""
    bare = [f for f in fits if f.op in DISPATCH_OPS]
    if not bare:
        raise SpecError("calibration has no host-dispatch measurements (add, layer_norm, linear)")
    for f in bare:
        if f.problem:
            raise SpecError(f.problem)
    by_op = {f.op: f for f in fits}
    module = by_op.get(MODULE_OP)
    extra = 0.0
    if module is not None and "linear" in by_op and not module.problem:
        extra = max(0.0, module.overhead - by_op["linear"].overhead)
    return HostDispatch(seconds=statistics.median(f.overhead for f in bare), module=extra,
                        ops=tuple(f.op for f in bare))
