"""Search: every parallel plan for a model on N GPUs, evaluated in bulk, ranked; the rest rejected with reasons.

Candidates → (vectorised) evaluation → feasible / rejected-with-reason → top-k. Exhaustive and exact: the
cost of every candidate is the cost ``estimate()`` gives it (the same functions, on arrays), and nothing is
pruned unless it cannot win: GPipe has the step time of 1F1B with at least its memory, so it can tie but
never beat it (it is evaluated all the same, and ties are broken towards less memory).

How it is fast (DESIGN.md example 4): per-micro-batch costs of a layer, the embedding, the head and a pipeline
send (``estimate.Units``) depend only on tp, cp, micro-batch, ep, etp, the strides of tp / cp / pp on the mesh
and the categorical settings; they are computed once per distinct key. ``estimate.assemble`` then turns them
into step time and memory for every candidate at once with NumPy, in chunks, so memory stays bounded.

Space (``Space``): all factorisations N = dp·tp·pp·cp; every divisor micro-batch; virtual stages v dividing
the layers per stage (interleaved when v > 1); ep dividing the experts and etp dividing tp; ZeRO 0–3;
recompute none / selective / full; sequence parallelism on / off (when tp > 1); optimizer / activation
offload; and every distinct placement of the axes on the mesh (which axes share the NVLink domain).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from meshplan.batch import PlanBatch
from meshplan.efficiency import DEFAULT, Efficiency
from meshplan.estimate import Estimate, Units, assemble, estimate, unit_costs
from meshplan.hardware import Cluster
from meshplan.model import ModelSpec
from meshplan.plan import DENSE_AXES, Plan
from meshplan.units import fmt_bytes

PLACEMENTS = tuple(itertools.permutations(DENSE_AXES))
CHUNK = 1 << 16


@dataclass(frozen=True, kw_only=True)
class Space:
    """What the search may choose. Environment settings (precision, overlap, gradient bytes) are fixed."""

    global_batch: int
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    sequence_parallel: tuple[bool, ...] = (False, True)
    offload: tuple[tuple[bool, bool], ...] = ((False, False), (True, False), (False, True), (True, True))
    gpipe: bool = True
    all_placements: bool = True
    max_micro_batch: int = 64
    precision: str = "bf16"
    grad_bytes: int = 4
    overlap_tp: bool = False
    overlap_dp: bool = True
    flash_attention: bool = True

    @property
    def settings(self) -> dict[str, object]:
        return {"precision": self.precision, "grad_bytes": self.grad_bytes, "overlap_tp": self.overlap_tp,
                "overlap_dp": self.overlap_dp, "flash_attention": self.flash_attention}


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

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model.name, "system": self.cluster.name, "gpus": self.cluster.num_gpus,
            "global_batch": self.space.global_batch, "evaluated": self.evaluated, "feasible": self.feasible,
            "rejected": {"count": self.rejected_total, "reasons": dict(self.rejected), "examples": dict(self.examples)},
            "seconds": self.seconds, "plans_per_second": self.evaluated / self.seconds if self.seconds else None,
            "plans": [e.to_dict() | {"ops": None} for e in self.plans],
        }


# ---- candidates ------------------------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class _Tally:
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, example: str, count: int) -> None:
        if count:
            self.counts[reason] += count
            self.examples.setdefault(reason, example)


def _tensor_reason(model: ModelSpec, tp: int) -> tuple[str, str] | None:
    if model.num_heads % tp:
        return "tp does not divide num_heads", f"tp={tp} does not divide num_heads={model.num_heads}"
    if not model.is_mla and model.num_kv_heads % tp and tp % model.num_kv_heads:
        return "tp and num_kv_heads do not divide", f"tp={tp}, num_kv_heads={model.num_kv_heads}"
    if model.ffn_hidden_size % tp:
        return "tp does not divide ffn_hidden_size", f"tp={tp} does not divide ffn={model.ffn_hidden_size}"
    return None


def _placements(sizes: dict[str, int], everything: bool) -> list[int]:
    """Indices into PLACEMENTS with distinct strides for the axes larger than 1."""
    if not everything:
        return [0]
    seen, keep = set(), []
    for i, order in enumerate(PLACEMENTS):
        stride, key = 1, []
        for axis in order:
            if sizes[axis] > 1:
                key.append((axis, stride))
            stride *= sizes[axis]
        if tuple(key) not in seen:
            seen.add(tuple(key))
            keep.append(i)
    return keep


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


def candidates(model: ModelSpec, cluster: Cluster, space: Space) -> tuple[dict[str, np.ndarray], _Tally]:
    """Numeric columns of every structurally valid candidate, and the tally of the invalid ones.

    An invalid numeric combination is counted once per categorical setting it would have been paired with.
    """
    n, gbs, layers = cluster.num_gpus, space.global_batch, model.num_layers
    cat = len(space.zero) * len(space.recompute) * len(space.offload)
    tally, columns = _Tally(), []
    for tp, cp, pp in itertools.product(divisors(n), repeat=3):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        mult = cat * (len(space.sequence_parallel) if tp > 1 else 1)
        reason = _tensor_reason(model, tp)
        if reason is None and cp > 1 and model.seq_length % (2 * cp):
            reason = ("2*cp does not divide seq_length", f"cp={cp}, seq_length={model.seq_length}")
        if reason is None and pp > layers:
            reason = ("pp exceeds num_layers", f"pp={pp} > num_layers={layers}")
        if reason is None and gbs % dp:
            reason = ("dp does not divide global_batch", f"dp={dp} does not divide global_batch={gbs}")
        if reason is not None:
            tally.add(*reason, mult)
            continue
        micro = [b for b in divisors(gbs // dp) if b <= space.max_micro_batch]
        vpps = [1] + [v for v in divisors(layers // pp) if v > 1] * (pp > 1 and layers % pp == 0)
        experts, bad = _expert_pairs(model, tp, tp * cp * dp)
        tally.add("ep*etp does not divide tp*cp*dp or num_experts", f"tp={tp} cp={cp} dp={dp}",
                  bad * mult * len(micro) * len(vpps))
        sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        grid = np.array(list(itertools.product(micro, vpps, range(len(experts)),
                                               _placements(sizes, space.all_placements))), dtype=np.int64)
        if not len(grid):
            continue
        mbs, vpp, e, pid = grid.T
        m = gbs // (dp * mbs)
        bad_interleave = (vpp > 1) & (m % pp != 0)
        tally.add("interleaved: pp does not divide the micro-batches", f"pp={pp}, dp={dp}",
                  int(bad_interleave.sum()) * mult)
        keep = ~bad_interleave
        pairs = np.array(experts, dtype=np.int64)[e[keep]]
        count = int(keep.sum())
        columns.append({"dp": np.full(count, dp), "tp": np.full(count, tp), "pp": np.full(count, pp),
                        "cp": np.full(count, cp), "ep": pairs[:, 0], "etp": pairs[:, 1], "vpp": vpp[keep],
                        "micro_batch": mbs[keep], "global_batch": np.full(count, gbs), "placement_id": pid[keep]})
    if not columns:
        return {}, tally
    return {k: np.concatenate([c[k] for c in columns]).astype(np.int64) for k in columns[0]}, tally


# ---- evaluation ------------------------------------------------------------------------------------------------
_UNIT_KEYS = ("tp", "cp", "micro_batch", "ep", "etp")


def _units_for(model: ModelSpec, cluster: Cluster, batch: PlanBatch, eff: Efficiency) -> Units:
    """Units for every plan of ``batch``, computed once per distinct key."""
    keys = np.stack([getattr(batch, k) for k in _UNIT_KEYS] + [batch.stride(a) for a in ("tp", "cp", "pp")])
    unique, inverse = np.unique(keys, axis=1, return_inverse=True)
    ones = np.ones(unique.shape[1], dtype=np.int64)
    cols = dict(zip(_UNIT_KEYS, unique[:5], strict=True))
    strides = {"tp": unique[5], "cp": unique[6], "pp": unique[7], "dp": ones}
    keyed = PlanBatch(dp=ones, pp=ones, vpp=ones, global_batch=cols["micro_batch"], placement_id=0 * ones,
                      placements=batch.placements, strides=strides, **cols,
                      **{k: getattr(batch, k) for k in ("sequence_parallel", "recompute", "precision", "grad_bytes",
                                                        "overlap_tp", "flash_attention")})
    return unit_costs(model, cluster, keyed, eff).take(inverse.reshape(-1))


def _groups(batch: PlanBatch, space: Space) -> Iterator[tuple[np.ndarray, dict[str, object]]]:
    """(rows, categorical settings) of every group assemble() evaluates in one call."""
    flat = batch.vpp == 1
    for zero, (off_opt, off_act) in itertools.product(space.zero, space.offload):
        base = {"zero": zero, "offload_optimizer": off_opt, "offload_activations": off_act}
        yield np.flatnonzero(flat), base | {"schedule": "1f1b"}
        if space.gpipe:
            yield np.flatnonzero(flat & (batch.pp > 1)), base | {"schedule": "gpipe"}
        yield np.flatnonzero(~flat), base | {"schedule": "interleaved"}


@dataclass
class _Best:
    """The k best feasible plans seen so far (bounded memory)."""

    k: int
    rows: list[tuple[float, float, tuple]] = field(default_factory=list)

    def offer(self, times: np.ndarray, peaks: np.ndarray, make: Callable[[int], Plan]) -> None:
        if not len(times):
            return
        top = np.argsort(times, kind="stable")[: self.k]
        self.rows += [(float(times[i]), float(peaks[i]), _plan_key(make(int(i)))) for i in top]
        self.rows.sort(key=lambda r: (r[0], r[1], r[2][0]))
        del self.rows[self.k * 4:]


def _plan_key(plan: Plan) -> tuple:
    order = (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep, plan.etp, plan.vpp, plan.micro_batch, plan.zero,
             plan.recompute, plan.sequence_parallel, plan.schedule, plan.offload_optimizer, plan.offload_activations,
             plan.placement)
    return (order, plan)


def search(model: ModelSpec, cluster: Cluster, space: Space, top_k: int = 10, eff: Efficiency = DEFAULT,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Evaluate every candidate of ``space``; return the ``top_k`` feasible plans (as full Estimates), the
    number evaluated, and the rejected ones tallied by reason. ``progress(done, total)`` is called per chunk."""
    start = time.perf_counter()
    columns, tally = candidates(model, cluster, space)
    capacity = cluster.accelerator.hbm_bytes
    best, evaluated, feasible = _Best(top_k), 0, 0
    total = _total_work(columns, space)
    if columns:
        base = PlanBatch(**columns, placements=PLACEMENTS, **space.settings)
        for sp in space.sequence_parallel:
            pool = base.select(base.tp > 1 if sp else np.ones(len(base), bool), sequence_parallel=sp)
            for recompute in space.recompute:
                with_rc = pool.select(np.arange(len(pool)), recompute=recompute)
                units = _units_for(model, cluster, with_rc, eff)
                for rows, settings in _groups(with_rc, space):
                    for chunk in _chunks(rows):
                        batch = with_rc.select(chunk, **settings)
                        costs = assemble(model, cluster, batch, units.take(chunk), eff)
                        peak, step = np.asarray(costs.peak_memory), np.asarray(costs.step_time)
                        fits = peak <= capacity
                        evaluated += len(chunk)
                        feasible += int(fits.sum())
                        over = np.flatnonzero(~fits)
                        if len(over):
                            tally.add("memory exceeds HBM", f"{batch.plan(int(over[0])).describe()}: memory "
                                      f"{fmt_bytes(float(peak[over[0]]))} > {fmt_bytes(capacity)}", len(over))
                        ok = np.flatnonzero(fits)
                        best.offer(step[ok], peak[ok], lambda i, b=batch, ok=ok: b.plan(int(ok[i])))
                        if progress:
                            progress(evaluated, total)
    plans = tuple(estimate(model, cluster, key[1], eff) for _, _, key in best.rows[:top_k])
    return SearchResult(model=model, cluster=cluster, space=space, plans=plans, evaluated=evaluated,
                        feasible=feasible, rejected=dict(tally.counts), examples=dict(tally.examples),
                        seconds=time.perf_counter() - start)


def _chunks(rows: np.ndarray) -> Iterator[np.ndarray]:
    for i in range(0, len(rows), CHUNK):
        yield rows[i:i + CHUNK]


def _total_work(columns: dict[str, np.ndarray], space: Space) -> int:
    if not columns:
        return 0
    tp, vpp, pp = columns["tp"], columns["vpp"], columns["pp"]
    per_setting = len(space.zero) * len(space.offload) * len(space.recompute)
    rows = sum(int((tp > 1).sum()) if sp else len(tp) for sp in space.sequence_parallel)
    gpipe = sum(int(((tp > 1) & (vpp == 1) & (pp > 1)).sum()) if sp else int(((vpp == 1) & (pp > 1)).sum())
                for sp in space.sequence_parallel) if space.gpipe else 0
    return per_setting * (rows + gpipe)
