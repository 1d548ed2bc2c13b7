"""Search: every parallel plan for a model on N GPUs, evaluated in bulk, ranked; the rest rejected with reasons.

Candidates → (vectorised) evaluation → feasible / rejected-with-reason → top-k. Exhaustive and exact: the
cost of every candidate is the cost ``estimate()`` gives it (the same functions, on arrays), and nothing is
pruned unless it cannot win: GPipe has the step time of 1F1B with at least its memory, so it can tie but
never beat it; such plans are counted as dominated rather than evaluated unless ``Space.gpipe`` asks for
them (ties are broken towards less memory).

How it is fast (DESIGN.md example 4): per-micro-batch costs of a layer, the embedding, the head and a pipeline
send (``estimate.Units``) depend only on tp, cp, micro-batch, ep, etp, the strides of tp / cp / pp on the mesh
and the categorical settings; they are computed once per distinct key. ``estimate.assemble`` then turns them
into step time and memory for every candidate at once with NumPy, in chunks, so memory stays bounded. Memory,
and a lower bound on the step time, depend on the size combination (every numeric field but the placement) and
on a unit's kernel times and saved activations, which depend on the op shapes alone: they are computed once
per size combination. Only the combinations whose bound can still reach the top k have their placements built,
their unit keys' collectives priced (``keyed.KeyUnits``) and their step time computed (branch and bound).

Space (``Space``): all factorisations N = dp·tp·pp·cp; every divisor micro-batch; virtual stages v dividing
the layers per stage (interleaved when v > 1); ep dividing the experts and etp dividing tp; ZeRO 0–3;
recompute none / selective / full; sequence parallelism on / off (when tp > 1); optimizer / activation
offload; and every distinct placement of the axes on the mesh (which axes share the NVLink domain).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from meshplan.channels import Offload, Passes, dp_collectives, offload, optimizer_time, step_channels
from meshplan.comm import Layout, block_members
from meshplan.cost.params import StageParams, layers_on_last, layers_on_stage, stage_params
from meshplan.errors import SpecError
from meshplan.estimate import Estimate, estimate
from meshplan.fields import MAX_PLANS
from meshplan.groups import send_stride
from meshplan.memory import buffer_memory, model_states
from meshplan.search.batch import CATEGORICAL, PlanBatch
from meshplan.search.keyed import KeyUnits, distinct, panel_counts
from meshplan.specs.check import fsdp_has_zero, recompute_modules_problem, ring_window_reason, settings_problems
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import DENSE_AXES, LAYOUTS, Plan
from meshplan.specs.stack import DEFAULT as DEFAULT_STACK
from meshplan.specs.stack import Stack
from meshplan.step.memory import activation_memory, offloaded_activations
from meshplan.step.stages import bubble_time, stage_times
from meshplan.step.units import Units
from meshplan.units import fmt_bytes

PLACEMENTS = tuple(itertools.permutations(DENSE_AXES))
CHUNK = 16384


@dataclass(frozen=True, kw_only=True)
class Space:
    """What the search may choose. Environment settings (precision, overlap, gradient bytes) are fixed."""

    global_batch: int
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    recompute_modules: tuple[str, ...] = ("core_attn",)  # Plan.recompute_modules: what "selective" recomputes
    sequence_parallel: tuple[bool, ...] = (False, True)
    layouts: tuple[str, ...] = ("1d", "summa")
    cp_min: int = 1  # context-parallel sizes considered (a strategy comparison pins them)
    cp_max: int = 0  # 0: no limit
    offload_optimizer: tuple[bool, ...] = (False, True)
    offload_activations: tuple[bool, ...] = (False, True)
    gpipe: bool = False  # GPipe: the step time of 1F1B with at least its memory (dominated; see the docstring)
    all_placements: bool = True
    max_micro_batch: int = 64
    precision: str = "bf16"
    grad_bytes: int = 4
    stack: Stack = DEFAULT_STACK  # how the software stack runs every plan (stack.py): its kernels, runtime, overlap
    # the most plans a search space may hold (``plan_count``); a larger one is refused before any is built
    # (fields.MAX_PLANS); 0: no limit
    max_plans: int = MAX_PLANS

    def __post_init__(self) -> None:
        if not all(fsdp_has_zero(self.stack.fsdp, z) for z in self.zero):
            raise ValueError(f"fsdp={self.stack.fsdp} has no ZeRO-1 strategy: search zero in 0, 2, 3")
        problem = recompute_modules_problem(self.recompute_modules)
        if problem:
            raise ValueError(f"recompute_modules={self.recompute_modules!r} {problem}")

    @property
    def settings(self) -> dict[str, object]:
        """The plan fields every plan of the space shares."""
        return {"precision": self.precision, "grad_bytes": self.grad_bytes, "recompute_modules": self.recompute_modules}


@dataclass(frozen=True)
class SearchResult:
    model: ModelSpec
    cluster: Cluster
    space: Space
    plans: tuple[Estimate, ...]  # feasible, best first
    evaluated: int
    feasible: int
    rejected: dict[str, int]  # reason → count
    examples: dict[str, str]  # reason → one concrete instance
    seconds: float
    bounded: int = 0  # of the evaluated plans: step time not computed, a lower bound keeps them out of the top k

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model.name, "system": self.cluster.name, "gpus": self.cluster.num_gpus,
            "global_batch": self.space.global_batch, "evaluated": self.evaluated, "feasible": self.feasible,
            "bounded": self.bounded,
            "rejected": {"count": self.rejected_total, "reasons": dict(self.rejected), "examples": dict(self.examples)},
            "seconds": self.seconds, "plans_per_second": self.evaluated / self.seconds if self.seconds else None,
            "plans": [e.to_dict(ops=False) for e in self.plans],
        }


# ---- candidates ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, from the pairs (d, n / d) with d ≤ √n."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass
class _Tally:
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)  # how far a scored example misses (lowest kept)

    def add(self, reason: str, example: str, count: int, score: float | None = None) -> None:
        """Count ``count`` plans rejected for ``reason``; keep the first example, or with a ``score`` the one
        that misses least (the nearest plan to fitting, for memory)."""
        if not count:
            return
        self.counts[reason] += count
        if score is None:
            self.examples.setdefault(reason, example)
        elif example and score < self.scores.get(reason, math.inf):
            self.examples[reason], self.scores[reason] = example, score


def _tensor_reason(model: ModelSpec, tp: int) -> tuple[str, str] | None:
    if model.num_heads % tp:
        return "tp does not divide num_heads", f"tp={tp} does not divide num_heads={model.num_heads}"
    if not model.is_mla and model.num_kv_heads % tp and tp % model.num_kv_heads:
        return "tp and num_kv_heads do not divide", f"tp={tp}, num_kv_heads={model.num_kv_heads}"
    if model.ffn_hidden_size % tp:
        return "tp does not divide ffn_hidden_size", f"tp={tp} does not divide ffn={model.ffn_hidden_size}"
    if "M" in model.layer_pattern and (model.mamba_heads % tp or model.mamba_groups % tp):
        return ("tp does not divide the Mamba heads and groups",
                f"tp={tp}, mamba_heads={model.mamba_heads}, mamba_groups={model.mamba_groups}")
    return None


_PLACEMENT_ID = {order: i for i, order in enumerate(PLACEMENTS)}


_ORDER = np.array([[DENSE_AXES.index(a) for a in order] for order in PLACEMENTS])  # (orders, axes): axis ids
_AX = {a: i for i, a in enumerate(DENSE_AXES)}


def _placements_many(sizes: np.ndarray, tiers: tuple[int, ...]) -> list[list[int]]:
    """For each row of axis sizes (rows × DENSE_AXES): the first of every group of axis orders with the same
    key (the tier split of each communicating group: tp, tp2, cp, the pipeline neighbours and the dp·cp gradient
    group). Exact: orders with equal keys cost the same; an MoE model's expert-parallel and expert-data-parallel
    groups split alike whenever those do (tests/test_search.py checks both against a scalar reference key).
    All orders of all rows at once with NumPy."""
    rows = len(sizes)
    in_order = sizes[:, _ORDER]  # (rows, orders, axes in order)
    inner = np.cumprod(in_order, axis=2) // in_order  # product of the axes placed before each one
    strides = np.empty_like(inner)
    np.put_along_axis(strides, np.broadcast_to(_ORDER, inner.shape), inner, axis=2)  # back to axis order
    size = {a: sizes[:, i][:, None] for a, i in _AX.items()}
    s = {a: strides[:, :, i] for a, i in _AX.items()}
    groups: list[tuple[Any, Layout, Any]] = [(size[a], s[a], True) for a in ("tp", "tp2", "cp")]
    groups += [(size["dp"] * size["cp"], ((size["cp"], s["cp"]), (size["dp"], s["dp"])), True),
               (2, send_stride(s["pp"], size["pp"]), size["pp"] > 1)]  # no sends when pp = 1
    columns, span = [np.repeat(np.arange(rows), len(PLACEMENTS))], 1  # (row, order) flattened, row-major
    for tier in tiers[:-1]:  # members inside each boundary determine the whole split
        span *= tier
        for group, layout, active in groups:
            members = np.where(active, block_members(group, layout, span), 0)
            columns.append(np.rint(np.broadcast_to(members, inner.shape[:2])).astype(np.int64).reshape(-1))
    first = distinct(np.stack(columns))[0]
    first.sort()
    combo, order = np.divmod(first, len(PLACEMENTS))
    return [order[combo == r].tolist() for r in range(rows)] if rows > 1 else [order.tolist()]


def _expert_pairs(model: ModelSpec, tp: int, ranks: int) -> tuple[list[tuple[int, int]], int]:
    """(ep, etp) pairs that are valid, and how many were not."""
    if not model.is_moe:
        return [(1, tp)], 0
    pairs, bad = [], 0
    for ep in divisors(model.num_experts):
        for etp in divisors(tp):
            if ranks % (ep * etp) or model.moe_ffn_hidden_size % etp:
                bad += 1
            else:
                pairs.append((ep, etp))
    return pairs, bad


def _layout_reason(model: ModelSpec, layout: str, tp2: int, cp: int) -> tuple[str, str] | None:
    if model.is_hybrid and "M" in model.layer_pattern and cp > 1:
        return "cp of Mamba layers not modelled", f"cp={cp} with {model.name}'s Mamba blocks"
    if layout == "1d":
        return None
    if model.is_hybrid:
        return "summa: not for hybrid models", f"{model.name} has a layer_pattern"
    if model.is_moe or model.is_mla:
        return "summa: dense standard-attention models only", f"{model.name} is MoE or MLA"
    if model.seq_length % (tp2 * cp):
        return "tp2*cp does not divide seq_length", f"tp2={tp2}, cp={cp}, seq_length={model.seq_length}"
    if model.hidden_size % tp2 or model.ffn_hidden_size % tp2:
        return "tp2 does not divide the hidden or FFN size", f"tp2={tp2}, hidden={model.hidden_size}"
    return None


def _grids(n: int, space: Space) -> Iterator[tuple[int, int, int, int, str]]:
    """(tp, tp2, cp, pp, layout) with tp·tp2·cp·pp dividing n: tp2 = 1 for 1D, tp2 >= 2 for SUMMA."""
    divs = divisors(n)
    for tp, cp, pp in itertools.product(divs, repeat=3):
        if n % (tp * cp * pp):
            continue
        if "1d" in space.layouts:
            yield tp, 1, cp, pp, "1d"
        if "summa" in space.layouts:
            for tp2 in divisors(n // (tp * cp * pp))[1:]:
                yield tp, tp2, cp, pp, "summa"


@dataclass
class _Combo:
    tp: int
    tp2: int
    cp: int
    pp: int
    dp: int
    layout: str
    mult: int
    micro: list[int]
    vpps: list[int]
    experts: list[tuple[int, int]]
    panel: int


def candidates(model: ModelSpec, cluster: Cluster, space: Space) -> tuple[dict[str, np.ndarray], _Tally]:
    """Numeric columns of every structurally valid candidate, and the tally of the invalid ones.

    An invalid numeric combination is counted once per categorical setting it would have been paired with.
    """
    combos, tally = _combos(model, cluster, space)
    return _columns(combos, cluster, space, tally), tally


def _columns(combos: list[_Combo], cluster: Cluster, space: Space, tally: _Tally) -> dict[str, np.ndarray]:
    """Every candidate of these size combinations: micro-batch × interleaving × experts × placements, in that
    nesting order (placements innermost), built for all combinations at once."""
    sized = _size_rows(combos, cluster, space, tally)
    if sized is None:
        return {}
    return _expand(sized, np.arange(len(sized.count)))


@dataclass(frozen=True)
class _Sized:
    """Candidates before their placements: one row per size combination (every numeric plan field but the
    placement; ``placement_id`` holds its first placement), and each row's distinct placements, ``count`` of them
    from ``start`` in ``pids``. Memory and the lower bound do not depend on the placement: the search builds a
    combination's plans only if it may time them."""

    columns: dict[str, np.ndarray]
    pids: np.ndarray
    start: np.ndarray
    count: np.ndarray

    def select(self, rows: np.ndarray) -> _Sized:
        return _Sized({k: v[rows] for k, v in self.columns.items()}, self.pids, self.start[rows], self.count[rows])


def _size_rows(combos: list[_Combo], cluster: Cluster, space: Space, tally: _Tally) -> _Sized | None:
    """The size combinations of these (tp, tp2, cp, pp, dp) combinations: micro-batch × interleaving × experts,
    in that nesting order, with their distinct placements; the interleaved ones whose micro-batches pp does not
    divide tallied (once per placement and setting they would have had)."""
    if not combos:
        return None
    if space.all_placements:
        sizes = np.array([[getattr(c, a) for a in DENSE_AXES] for c in combos], dtype=np.int64)
        placements = _placements_many(sizes, cluster.mesh_shape)
    else:
        placements = [[0]] * len(combos)
    micro, n_micro = _ragged([c.micro for c in combos])
    vpps, n_vpp = _ragged([c.vpps for c in combos])
    experts, n_exp = _ragged([[e * 1_000_000 + t for e, t in c.experts] for c in combos])  # (ep, etp) packed
    (pids, pid_start), n_pid = _ragged(placements)
    per_combo = n_micro * n_vpp * n_exp
    combo = np.repeat(np.arange(len(combos)), per_combo)
    local = np.arange(len(combo)) - np.repeat(np.cumsum(per_combo) - per_combo, per_combo)
    local, i_exp = np.divmod(local, n_exp[combo])
    i_micro, i_vpp = np.divmod(local, n_vpp[combo])
    mbs, vpp = micro[0][micro[1][combo] + i_micro], vpps[0][vpps[1][combo] + i_vpp]
    pair = experts[0][experts[1][combo] + i_exp]
    field = {name: np.array([getattr(c, name) for c in combos], dtype=np.int64)
             for name in ("dp", "tp", "pp", "cp", "tp2", "panel", "mult")}
    layout = np.array([LAYOUTS.index(c.layout) for c in combos], dtype=np.int64)
    bad = (vpp > 1) & ((space.global_batch // (field["dp"][combo] * mbs)) % field["pp"][combo] != 0)
    bad_per_combo = np.bincount(combo[bad], minlength=len(combos)) * n_pid
    if bad_per_combo.any():
        first = combos[int(np.flatnonzero(bad_per_combo)[0])]
        tally.add("interleaved: pp does not divide the micro-batches", f"pp={first.pp}, dp={first.dp}",
                  int((bad_per_combo * field["mult"]).sum()))
    keep = ~bad
    combo = combo[keep]
    columns = {name: field[name][combo] for name in ("dp", "tp", "pp", "cp", "tp2")}
    ep, etp = np.divmod(pair[keep], 1_000_000)
    columns |= {"ep": ep, "etp": etp, "vpp": vpp[keep], "micro_batch": mbs[keep],
                "global_batch": np.full(len(combo), space.global_batch, dtype=np.int64),
                "summa_panels": field["panel"][combo], "placement_id": pids[pid_start[combo]], "layout": layout[combo]}
    return _Sized(columns, pids, pid_start[combo], n_pid[combo])


def _expand(sized: _Sized, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The plans of size rows ``rows``: each row once per distinct placement (placements innermost)."""
    count = sized.count[rows]
    row = np.repeat(rows, count)
    offset = np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)
    return {k: v[row] for k, v in sized.columns.items()} | {"placement_id": sized.pids[sized.start[row] + offset]}


def _ragged(lists: list[list[int]]) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """A list of int lists as (concatenated values, start of each list) and the lengths."""
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum()))
    return (values, np.cumsum(lengths) - lengths), lengths


def _ep_overlap_options(tally: _Tally, experts: list[tuple[int, int]], vpps: list[int], pp: int, per: int
                        ) -> tuple[list[tuple[int, int]], list[int]]:
    """The expert and interleaving options a stack that overlaps the EP all-to-alls (Stack.overlap_ep) can run:
    ep > 1, and with a pipeline an interleaved schedule; the others tallied (``per`` plans each)."""
    kept_experts = [(e, t) for e, t in experts if e > 1]
    kept_vpps = [v for v in vpps if v > 1] if pp > 1 else vpps
    tally.add("overlap_ep needs ep > 1", f"pp={pp}", (len(experts) - len(kept_experts)) * len(vpps) * per)
    tally.add("overlap_ep needs vpp > 1 with pp > 1", f"pp={pp}",
              len(kept_experts) * (len(vpps) - len(kept_vpps)) * per)
    return kept_experts, kept_vpps


def _combos(model: ModelSpec, cluster: Cluster, space: Space) -> tuple[list[_Combo], _Tally]:
    """The valid (tp, tp2, cp, pp, dp, layout) combinations with their micro-batch, interleaving and expert
    options; the invalid ones tallied with their reason."""
    n, gbs, layers = cluster.num_gpus, space.global_batch, model.num_layers
    cat = _grid_size(space)
    tally, combos = _Tally(), []
    for tp, tp2, cp, pp, layout in _grids(n, space):
        if cp < space.cp_min or (space.cp_max and cp > space.cp_max):
            continue  # outside the space asked for, not a rejection
        dp = n // (tp * tp2 * cp * pp)
        mult = cat * (len(space.sequence_parallel) if tp > 1 and layout == "1d" else 1)
        reason = _tensor_reason(model, tp) or _layout_reason(model, layout, tp2, cp)
        if reason is None and cp > 1 and model.seq_length % (2 * cp):
            reason = ("2*cp does not divide seq_length", f"cp={cp}, seq_length={model.seq_length}")
        if reason is None and ring_window_reason(model, cp, space.stack.cp_comm):
            reason = ("ring context parallelism with a sliding window",
                      f"cp={cp}, sliding_window={model.sliding_window}")
        if reason is None and pp > layers:
            reason = ("pp exceeds num_layers", f"pp={pp} > num_layers={layers}")
        if reason is None and gbs % dp:
            reason = ("dp does not divide global_batch", f"dp={dp} does not divide global_batch={gbs}")
        panels = panel_counts(model.hidden_size, tp, tp2) if layout == "summa" else [max(tp, tp2)]
        if reason is None and not panels:
            reason = ("no SUMMA panel count divides hidden_size", f"tp={tp}, tp2={tp2}")
        if reason is not None:
            tally.add(*reason, mult)
            continue
        micro = [b for b in divisors(gbs // dp) if b <= space.max_micro_batch]
        vpps = [1] + [v for v in divisors(layers // pp) if v > 1] * (pp > 1 and layers % pp == 0)
        experts, bad = _expert_pairs(model, tp, tp * cp * dp)
        tally.add("ep*etp does not divide tp*cp*dp or num_experts", f"tp={tp} cp={cp} dp={dp}",
                  bad * mult * len(micro) * len(vpps))
        if space.stack.overlap_ep:  # Megatron-Core's combined 1F1B (plan.check): ep > 1, interleaved under a pipeline
            experts, vpps = _ep_overlap_options(tally, experts, vpps, pp, mult * len(micro))
        if micro and experts:
            combos.append(_Combo(tp, tp2, cp, pp, dp, layout, mult, micro, vpps, experts, panels[0]))
    return combos, tally


# ---- evaluation ------------------------------------------------------------------------------------------------
def _modes(space: Space) -> Iterator[tuple[str, bool]]:
    """(tensor layout, sequence parallelism) combinations; SP applies to the 1D layout only."""
    for layout in space.layouts:
        for sp in space.sequence_parallel if layout == "1d" else (False,):
            yield layout, sp


def _groups(batch: PlanBatch, space: Space) -> Iterator[tuple[np.ndarray, str]]:
    """(rows, schedule) of the plans that share a pipeline schedule."""
    flat = batch.vpp == 1
    yield np.flatnonzero(flat), "1f1b"
    if space.gpipe:
        yield np.flatnonzero(flat & (batch.pp > 1)), "gpipe"
    yield np.flatnonzero(~flat), "interleaved"


def _vec(x: object, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float32), (n,))


def _times(model: ModelSpec, cluster: Cluster, batch: PlanBatch, units: dict[str, Units], space: Space,
           eff: Efficiency) -> np.ndarray:
    """Step time of every settings combination of a chunk, shape (recompute, zero, offload opt, offload act, plan):
    estimate.assemble's step on arrays, each part computed for the settings it changes with: per recompute mode the
    ranks' passes and the bubble, per offload setting the copies, the channels beside the passes for every ZeRO stage
    at once (channels.step_channels), per ZeRO stage and optimizer offload the optimizer step; the first and the last
    pipeline rank side by side on a leading axis of 2, the longer step taken. float32 (ranking only; the winners are
    re-estimated in float64)."""
    rcs, zeros = space.recompute, space.zero
    oos, oas = space.offload_optimizer, space.offload_activations
    n, m, sd = len(batch), batch.grad_accum, eff.overlap_slowdown
    ends = (stage_params(model, batch, True), stage_params(model, batch, False))
    params = StageParams(*(_pair(getattr(ends[0], f), getattr(ends[1], f), n, np.float64)
                           for f in StageParams.__slots__))
    collectives = dp_collectives(model, cluster, batch, params, eff)  # the same for every ZeRO stage
    opt = {(z, oo): optimizer_time(cluster, replace(batch, zero=z, offload_optimizer=oo), params, eff)
           for z in zeros for oo in oos}
    out = np.empty((len(rcs), len(zeros), len(oos), len(oas), n), dtype=np.float32)
    forward: dict = {}  # the forward passes do not change with the recompute mode: priced once without copies
    for r, rc in enumerate(rcs):
        plan = replace(batch, recompute=rc)
        first, last, middle = stage_times(model, plan, space.stack, units[rc])
        bubble = bubble_time(plan, first.total, last.total, middle.total)
        pf, pl = first.passes(), last.passes()
        passes = Passes(*(_pair(getattr(pf, f), getattr(pl, f), n) for f in Passes.__slots__))
        pipelined = m * _pair(first.total, last.total, n)
        for a, oa in enumerate(oas):
            copies = Offload()
            if oa:
                with_oa = replace(plan, offload_activations=True)
                one, two = (offload(model, cluster, with_oa, units[rc].layer_saved, last) for last in (False, True))
                copies = Offload(_pair(one.copy, two.copy, n), _pair(one.share, two.share, n))
            channels = step_channels(passes, m, collectives, zeros, copies, sd, space.stack.overlap_dp, forward)
            for z, zero in enumerate(zeros):
                dp, moved = channels[zero]
                base = pipelined + dp + moved
                for o, oo in enumerate(oos):
                    rank = base + opt[zero, oo]
                    np.add(np.maximum(rank[0], rank[1]), bubble, out=out[r, z, o, a], casting="unsafe")
    return out


def _pair(first: object, last: object, n: int, dtype: type = np.float32) -> np.ndarray:
    """The first and the last rank's value of each plan, stacked: shape (2, n) (float32: the ranking's precision)."""
    out = np.empty((2, n), dtype=dtype)
    out[0], out[1] = first, last
    return out


def _memory(model: ModelSpec, batch: PlanBatch, units: dict[str, Units], space: Space
            ) -> tuple[np.ndarray, np.ndarray]:
    """Peak HBM and host (offload) bytes of every settings combination, shape (recompute, zero, offload opt,
    offload act, plan). Memory does not depend on the placement, so the search calls this once per size
    combination, not per placement."""
    rcs, zeros = space.recompute, space.zero
    oos, oas = space.offload_optimizer, space.offload_activations
    n = len(batch)
    with_rc = {rc: replace(batch, recompute=rc) for rc in rcs}
    ends = (stage_params(model, batch, True), stage_params(model, batch, False))
    # model states per ZeRO stage and end; an offloaded optimizer state leaves the GPU for the host
    # (estimate.offloaded_optimizer: the first rank's optimizer bytes)
    kept = {z: [model_states(end, replace(batch, zero=z, offload_optimizer=False), space.stack) for end in ends]
            for z in zeros}
    states = np.array([[[_vec(w + g + (0.0 if oo else o), n) for w, g, o in kept[z]] for oo in oos]
                       for z in zeros])  # (Z, O, 2, n)
    acts = np.array([[[_vec(a, n) for a in activation_memory(model, replace(with_rc[rc], offload_activations=oa),
                                                              space.stack, units[rc])] for oa in oas]
                      for rc in rcs])  # (R, A, 2, n)
    buffers = np.array([_vec(buffer_memory(model, replace(batch, zero=z)), n) for z in zeros])  # (Z, n)
    host_opt = np.array([[_vec(kept[z][0][2] if oo else 0.0, n) for oo in oos] for z in zeros])  # (Z, O, n)
    host_act = np.array([[_vec(offloaded_activations(model, replace(with_rc[rc], offload_activations=oa),
                                                     units[rc]), n) for oa in oas] for rc in rcs])  # (R, A, n)
    peak = states[None, :, :, None, 0] + acts[:, None, None, :, 0]  # (R, Z, O, A, n): the first rank
    np.maximum(peak, states[None, :, :, None, 1] + acts[:, None, None, :, 1], out=peak)  # or the last
    peak += buffers[None, :, None, None]
    return peak, host_opt[None, :, :, None] + host_act[:, None, None]


@dataclass
class _Best:
    """The k best feasible plans seen so far (bounded memory)."""

    k: int
    rows: list[tuple[float, float, tuple]] = field(default_factory=list)
    threshold: float = np.inf  # the k-th best time so far: nothing slower can enter

    def offer(self, times: np.ndarray, peaks: np.ndarray, make: Callable[[int], Plan]) -> None:
        """Keep the k fastest of these plans (``make(i)`` builds the i-th), ties broken towards less memory: of
        plans as fast as the k-th, the ones with the smaller peak."""
        if not len(times):
            return
        kth = np.partition(times, self.k - 1)[self.k - 1] if len(times) > self.k else np.inf
        tied = np.flatnonzero(times <= kth)
        top = tied[np.lexsort((peaks[tied], times[tied]))][: self.k]
        self.rows += [(float(times[i]), float(peaks[i]), _plan_key(make(int(i)))) for i in top]
        self.rows.sort(key=lambda r: (r[0], r[1], r[2][0]))
        del self.rows[self.k * 4:]
        if len(self.rows) >= self.k:
            self.threshold = self.rows[self.k - 1][0]


def _plan_key(plan: Plan) -> tuple:
    order = (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep, plan.etp, plan.vpp, plan.micro_batch, plan.zero,
             plan.recompute, plan.sequence_parallel, plan.schedule, plan.offload_optimizer, plan.offload_activations,
             plan.placement)
    return (order, plan)


# Plans before the settings grid (size combinations at about 8 placements each): below this one process is faster
# than forking two workers on a two-core machine. The work goes with the size combinations and unit keys (memory, the
# bound, pricing), whatever the grid of ZeRO / recompute / offload settings each is scored under: a search narrowed to
# one ZeRO stage without offload costs about what the full one does. benchmarks/search_speed.py --repeat 8 (medians,
# one / two workers): the quick start's Llama-3-70B on 1024 H100 (~190k) 0.33 / 0.43 s; Llama-3.1-405B on 16,384
# H100 (~257k) 0.65 / 0.59 s, Megatron-1T (~340k) 0.58 / 0.55 s, DeepSeek-V3 (~441k) 0.66 / 0.52 s; GPT-3 175B (~425k,
# five in six of its plans SUMMA, whose jobs balance worse) is the exception at 0.42 / 0.51 s
PARALLEL_ABOVE = 220_000


@dataclass
class _Part:
    """What one share of the search found (small: it crosses a process boundary)."""

    best: _Best
    evaluated: int = 0
    feasible: int = 0
    bounded: int = 0  # evaluated plans whose step time a lower bound showed cannot reach the top k
    tally: _Tally = field(default_factory=_Tally)


@dataclass(frozen=True)
class _Job:
    """The plans one worker evaluates: one tensor mode (layout, sequence parallelism) and some of the size
    combinations of that layout (indices into the combination list)."""

    mode: tuple[str, bool]
    combos: tuple[int, ...]
    weight: int  # candidates before placements (for the order in which jobs are handed out)


def _jobs(combos: list[_Combo], space: Space, parts: int) -> list[_Job]:
    """Each tensor mode's combinations in ``parts`` shares of about equal size, largest first. A share holds
    whole (tp, tp2, cp) groups: those decide the per-layer units, which are then computed by one job only."""
    jobs = []
    for mode in _modes(space):
        groups: dict[tuple[int, int, int], list[int]] = {}
        for i, c in enumerate(combos):
            if c.layout == mode[0]:
                groups.setdefault((c.tp, c.tp2, c.cp), []).append(i)
        size = {key: sum(_weight(combos[i]) for i in members) for key, members in groups.items()}
        bins: list[list[int]] = [[] for _ in range(parts)]
        load = [0] * parts
        for key in sorted(groups, key=lambda k: -size[k]):  # longest processing time first
            b = load.index(min(load))
            bins[b] += groups[key]
            load[b] += size[key]
        jobs += [_Job(mode, tuple(sorted(b)), w) for b, w in zip(bins, load, strict=True) if b]
    return sorted(jobs, key=lambda j: -j.weight)


def _weight(c: _Combo) -> int:
    return len(c.micro) * len(c.vpps) * len(c.experts)


_SHARED: dict[str, object] = {}  # the candidates, inherited by forked workers instead of pickled


def search(model: ModelSpec, cluster: Cluster, space: Space, top_k: int = 10, eff: Efficiency = DEFAULT,
           progress: Callable[[int, int], None] | None = None, workers: int = 0) -> SearchResult:
    """Evaluate every candidate of ``space``; return the ``top_k`` feasible plans (as full Estimates), the
    number evaluated, and the rejected ones tallied by reason. ``progress(done, total)`` counts finished
    jobs. ``workers``: processes to use (0: up to 2 when the space is large; 1: this process only)."""
    start = time.perf_counter()
    combos, tally = _combos(model, cluster, space)
    _check_size(model, cluster, space, combos)
    if not workers:
        placed = sum(_weight(c) for c in combos) * 8  # size combinations at about 8 placements each
        workers = min(2, os.cpu_count() or 1) if placed > PARALLEL_ABOVE else 1
    jobs = _jobs(combos, space, 1 if workers == 1 else 2 * workers)  # balanced as the workers take them
    args = (model, cluster, space, top_k, eff)
    results: list[_Part] = []
    if workers == 1:
        for job in jobs:
            results.append(_evaluate(job, combos, *args))
            if progress:
                progress(len(results), len(jobs))
    else:
        _SHARED.update(combos=combos, args=args)
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                for part in pool.imap_unordered(_evaluate_shared, jobs):
                    results.append(part)
                    if progress:
                        progress(len(results), len(jobs))
        finally:
            _SHARED.clear()
    rows = sorted((row for part in results for row in part.best.rows), key=lambda r: (r[0], r[1], r[2][0]))
    for part in results:
        for reason, count in part.tally.counts.items():
            tally.add(reason, part.tally.examples.get(reason, ""), count, part.tally.scores.get(reason))
    # re-estimate the leaders in float64 (the ranking above used float32 sums) and rank them again
    estimates = [estimate(model, cluster, key[1], space.stack, eff) for _, _, key in rows[: 2 * top_k + 2]]
    estimates.sort(key=lambda e: (e.step_time, e.peak_memory, _plan_key(e.plan)[0]))
    return SearchResult(model=model, cluster=cluster, space=space, plans=tuple(estimates[:top_k]),
                        evaluated=sum(r.evaluated for r in results), feasible=sum(r.feasible for r in results),
                        bounded=sum(r.bounded for r in results),
                        rejected=dict(tally.counts), examples=dict(tally.examples),
                        seconds=time.perf_counter() - start)


def _unplaced(c: _Combo) -> int:
    """A combination's plans before placements: its micro-batch × interleaving × expert options × the grid."""
    return c.mult * _weight(c)


def plan_count(combos: list[_Combo], cluster: Cluster, space: Space) -> int:
    """The plans of these size combinations, counted before any is built: per combination its micro-batch ×
    interleaving × expert options × distinct placements × the categorical grid. The search evaluates all of them
    but the interleaved ones whose micro-batches pp does not divide, which it rejects."""
    per = np.array([_unplaced(c) for c in combos], dtype=np.int64)
    if not (space.all_placements and combos):
        return int(per.sum())
    sizes = np.array([[getattr(c, a) for a in DENSE_AXES] for c in combos], dtype=np.int64)
    placements = np.array([len(p) for p in _placements_many(sizes, cluster.mesh_shape)], dtype=np.int64)
    return int(per @ placements)


def _check_size(model: ModelSpec, cluster: Cluster, space: Space, combos: list[_Combo]) -> None:
    """Refuse a space of more than ``space.max_plans`` plans (counted only when every placement differing could
    exceed it: counting the distinct placements costs about what building them does), or whose shared settings no
    plan can take (a precision the GPU lacks: every plan would be invalid)."""
    problems = settings_problems(model, cluster, space.settings, space.stack)
    if space.stack.overlap_ep and "full" in space.recompute:
        problems.append("overlap_ep (Megatron-Core's combined 1F1B) cannot run full recompute: search recompute "
                        "none, selective")
    if space.stack.overlap_ep and model.mtp_layers > 1:
        problems.append(f"overlap_ep (Megatron-Core's combined 1F1B) needs at most one MTP layer "
                        f"(mtp_layers={model.mtp_layers})")
    if problems:
        raise SpecError("; ".join(problems))
    limit = space.max_plans
    if not limit or sum(map(_unplaced, combos)) * len(PLACEMENTS) <= limit:
        return
    count = plan_count(combos, cluster, space)
    if count > limit:
        raise SpecError(f"the search space of {model.name} on {cluster.num_gpus} GPUs holds {count:,} plans, more than "
                        f"max-plans={limit:,}: narrow it (--no-offload, --placements default; plan also --zero, "
                        "--recompute, --sp, --max-micro-batch) or raise --max-plans")


def check_space(model: ModelSpec, cluster: Cluster, space: Space) -> None:
    """Raise SpecError if ``space`` holds more than ``space.max_plans`` plans (``search`` checks it too; a sweep
    checks every point before any runs)."""
    _check_size(model, cluster, space, _combos(model, cluster, space)[0])


def _evaluate_shared(job: _Job) -> _Part:
    return _evaluate(job, _SHARED["combos"], *_SHARED["args"])


def _evaluate(job: _Job, combos: list[_Combo], model: ModelSpec, cluster: Cluster, space: Space, top_k: int,
              eff: Efficiency) -> _Part:
    """Build and score the candidates of one job: its tensor mode and its size combinations."""
    layout, sp = job.mode
    mine = [combos[i] for i in job.combos]
    result = _Part(_Best(top_k))
    first_mode = next(m for m in _modes(space) if m[0] == layout) == job.mode  # tally build rejections once
    sized = _size_rows(mine, cluster, space, result.tally if first_mode else _Tally())
    if sized is None:
        return result
    columns = {k: v for k, v in sized.columns.items() if k != "layout"}
    base = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
    rows = np.flatnonzero(base.tp > 1) if sp else np.arange(len(base))
    if not len(rows):
        return result
    pool = base.select(rows, sequence_parallel=sp, tensor_layout=layout)  # one row per size combination
    sized = replace(sized, columns=columns).select(rows)  # without the layout column
    units = KeyUnits(model, cluster, pool, space.stack, space.recompute, eff)
    if not space.gpipe:
        gpipe = int(sized.count[(pool.vpp == 1) & (pool.pp > 1)].sum()) * _grid_size(space)
        result.tally.add("dominated: GPipe (1F1B has its step time with less memory)", "any pp > 1 plan", gpipe)
    bound = _lower_bound(model, pool, units.shapes, units.shape_of)
    for group, schedule in _groups(pool, space):
        _score_group(model, cluster, space, eff, pool.select(group, schedule=schedule), sized.select(group),
                     bound[group], units.shape_of[group], units, result)
    return result


def _score_group(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, pool: PlanBatch, sized: _Sized,
                 bound: np.ndarray, shapes: np.ndarray, units: KeyUnits, result: _Part) -> None:
    """Score the size combinations of one schedule group (``pool``: one row each, with its lower ``bound`` and
    shape) in blocks, likely winners first so that the threshold tightens early: the memory of each combination
    is computed once for all its placements (``_fit``), then the plans that can still reach the top k are built
    and timed (``_time_rows``)."""
    order = np.argsort(bound, kind="stable")
    for block in _chunks(order, SIZE_BLOCK):
        fits, peak = _fit(model, cluster, space, pool.select(block), units.saved(shapes[block]), sized.count[block],
                          result)
        _time_rows(model, cluster, space, eff, pool, sized, block, bound, shapes, units, fits, peak, result)


SIZE_BLOCK = 16384  # size combinations whose memory is computed at once (it bounds the arrays' size)
BOUND_SLACK = 1e-5  # the float32 step-time sums may round below the float64 bound by a few 1e-8


def _lower_bound(model: ModelSpec, pool: PlanBatch, shapes: dict[str, Units], shape_of: np.ndarray) -> np.ndarray:
    """A lower bound on every setting's step time of each plan, from the kernel times of its shape (``shapes``;
    ``shape_of``: each plan's shape). Every rank runs at least its layers' forward and backward kernels per
    micro-batch, c = t_fwd + t_bwd of a layer, L_f of them on the first (and middle) ranks and L_l on the last,
    and the first rank the embedding's (e), the last the head's (h); everything else (communication, recompute,
    sends, DP, optimizer, offload) only adds. So the busiest rank takes at least B = max(L_f·c + e, L_l·c + h) (a
    single stage holds both: L·c + e + h), and the bubble, the other ranks' times over v
    (``estimate.bubble_time``), at least ((p − 1)·min(L_f, L_l)·c + min(e, h)) / v: the step takes at least
    m·B + that."""
    def least(part: str) -> np.ndarray:
        times = [np.broadcast_to(getattr(u, part).fwd + getattr(u, part).bwd, shape_of.max() + 1)
                 for u in shapes.values()]
        return np.minimum.reduce(times)[shape_of]

    layer = np.minimum(least("layer"), least("layer_plain"))
    first, last = layers_on_stage(model, pool) * layer, layers_on_last(model, pool) * layer
    embed, head = least("embed"), least("head")
    single = pool.pp == 1
    busiest = np.maximum(first + embed + single * head, last + head + single * embed)
    others = (pool.pp - 1) * np.minimum(first, last) + np.minimum(embed, head)
    return pool.grad_accum * busiest + ~single * others / pool.vpp


def _fit(model: ModelSpec, cluster: Cluster, space: Space, sized: PlanBatch, saved: dict[str, Units],
         plans: np.ndarray, result: _Part) -> tuple[np.ndarray, np.ndarray]:
    """Memory and feasibility of every setting of some size combinations (``sized``: one plan of each; memory
    does not depend on the placement), each standing for ``plans`` plans: counted as evaluated and feasible,
    those that do not fit tallied with their reason. Returns (fits, peak), shaped as ``_memory``'s."""
    grid = (space.recompute, space.zero, space.offload_optimizer, space.offload_activations)
    capacity, host_capacity = cluster.accelerator.hbm_bytes, cluster.host_memory
    peak, host = _memory(model, sized, saved, space)
    in_hbm, in_host = peak <= capacity, host <= host_capacity
    fits = in_hbm & in_host
    result.evaluated += int(plans.sum()) * fits[..., 0].size
    result.feasible += int(fits.reshape(-1, len(sized)).sum(axis=0) @ plans)
    _tally_misses(result.tally, "memory exceeds HBM", peak, ~in_hbm, plans, sized, grid, capacity)
    _tally_misses(result.tally, "offload exceeds host memory", host, in_hbm & ~in_host, plans, sized, grid,
                  host_capacity)
    return fits, peak


def _time_rows(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, pool: PlanBatch, sized: _Sized,
               block: np.ndarray, bound: np.ndarray, shapes: np.ndarray, units: KeyUnits, fits: np.ndarray,
               peak: np.ndarray, result: _Part) -> None:
    """The step time of the plans of the size combinations ``block`` (rows of ``pool``) whose lower bound can still
    reach the top k, in chunks (branch and bound: exact, a plan slower than the k-th best so far cannot enter):
    their placements are built and their keys priced only then; the others counted as bounded. ``fits`` and
    ``peak``: the block's, settings × combinations; where none fits, nothing is timed."""
    settings, any_fit = fits[..., 0].size, fits.any()
    fits, peak = fits.reshape(settings, -1), peak.reshape(settings, -1)
    count = sized.count[block]
    for piece in _pieces(count, result.best):
        near = piece[bound[block[piece]] * (1 - BOUND_SLACK) <= result.best.threshold]
        result.bounded += int(count[piece].sum() - count[near].sum()) * settings
        if len(near) and any_fit:
            rows = block[near]
            plans = PlanBatch(**_expand(sized, rows), placements=pool.placements,
                              **{k: getattr(pool, k) for k in CATEGORICAL})
            local = np.repeat(near, count[near])  # each plan's combination, in the block
            _time_chunk(model, cluster, space, eff, plans, np.repeat(shapes[rows], count[near]), units, fits, peak,
                        local, result)


FIRST_CHUNK = 1024  # plans timed at once while the k-th best time is unknown (every key they use is priced)


def _pieces(plans: np.ndarray, best: _Best) -> Iterator[np.ndarray]:
    """Consecutive ranges of size combinations holding about ``CHUNK`` plans each (``plans``: each one's), smaller
    ones (``FIRST_CHUNK``) until the k-th best time is known; at least one combination each."""
    ends, start = np.cumsum(plans), 0
    while start < len(plans):
        size = CHUNK if np.isfinite(best.threshold) else min(CHUNK, FIRST_CHUNK)
        done = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, done + size, side="right")))
        yield np.arange(start, stop)
        start = stop


def _time_chunk(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, batch: PlanBatch,
                shapes: np.ndarray, units: KeyUnits, fits: np.ndarray, peak: np.ndarray, sizes: np.ndarray,
                result: _Part) -> None:
    """Time the plans of ``batch`` (``shapes``: their shapes; ``sizes``: their columns in ``fits`` and ``peak``,
    settings × size combinations) under every setting and offer the fast enough ones that fit to the top k."""
    grid = (space.recompute, space.zero, space.offload_optimizer, space.offload_activations)
    full, panels = units.price(batch, shapes)
    time = _times(model, cluster, batch, full, space, eff)
    ok = np.flatnonzero(time.reshape(-1) <= result.best.threshold)  # fast enough, then: does it fit?
    setting, row = np.divmod(ok, len(batch))
    fit = fits[setting, sizes[row]]
    ok, setting, row = ok[fit], setting[fit], row[fit]
    nb = [panels[rc] for rc in space.recompute]
    result.best.offer(time.reshape(-1)[ok], peak[setting, sizes[row]],
                      lambda i: _decode(batch, grid, time.shape, int(ok[i]), nb))


def _decode(batch: PlanBatch, grid: tuple[tuple, ...], shape: tuple[int, ...], flat: int,
            panels: list[np.ndarray] | None = None) -> Plan:
    """The plan at a flat index of the (recompute, zero, offload opt, offload act, row) grid."""
    r, z, o, a, row = np.unravel_index(flat, shape)
    plan = replace(batch.plan(int(row)), recompute=grid[0][r], zero=grid[1][z], offload_optimizer=grid[2][o],
                   offload_activations=grid[3][a])
    return replace(plan, summa_panels=int(panels[r][row])) if panels is not None else plan


def _tally_misses(tally: _Tally, reason: str, used: np.ndarray, miss: np.ndarray, plans: np.ndarray,
                  sized: PlanBatch, grid: tuple[tuple, ...], capacity: float) -> None:
    """Count the plans that ``miss`` (settings × size combinations, each standing for ``plans`` plans) for
    ``reason``; the example is the plan nearest to fitting: the least bytes ``used`` among them."""
    count = int(miss.reshape(-1, len(plans)).sum(axis=0) @ plans)
    if not count:
        return
    flat = int(np.argmin(np.where(miss, used, np.inf).reshape(-1)))
    least = float(used.reshape(-1)[flat])
    if least >= tally.scores.get(reason, math.inf):
        tally.add(reason, "", count, least)
        return
    plan = _decode(sized, grid, miss.shape, flat)
    tally.add(reason, f"{plan.describe()}: {fmt_bytes(least)} > {fmt_bytes(capacity)}", count, least)


def _chunks(rows: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(rows), size):
        yield rows[i:i + size]


def _grid_size(space: Space) -> int:
    return len(space.zero) * len(space.recompute) * len(space.offload_optimizer) * len(space.offload_activations)
