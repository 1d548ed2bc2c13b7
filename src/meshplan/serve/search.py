"""The serving search: every configuration of a ServeSpace (space.py) on a cluster, priced at once with NumPy, the
ones that break a constraint or a latency target tallied by reason, the best re-estimated one by one.

How it is fast: a configuration's iteration times depend on its instance shape and batch (tp, pp, dpa, ep, batch)
and its quantisation, not on how many instances there are or how they split into prefill and decode pools; so the
instances' figures (metrics.instance) are computed once per shape and scheme on arrays, and every deployment of
them (replicas filling the GPUs, each prefill / decode split) is a few array operations (metrics.deployment).

The ranking (``ServeSpace.prefer_simple``), the training search's rule (search/select.py) on serving's figures: the
best configuration's throughput X (or TPOT, ranking by latency) sets the band X / (1 + b), b the serving ranking band
of the plan's regime (specs/bands.serving_ranking_band: the conformal band of the measured runs' throughput), within
which the model cannot tell two configurations apart. The best leads (a faster machine never makes #1 worse: issue
48); the others within the band follow it, the simplest first (fewer of tp, pp, dpa, ep above 1, a disaggregated
deployment and a format other than the checkpoint's, one each), then the ones on fewer GPUs, then the faster; the rest
after them, best first. ``ServeSpace.simplest_leads``: the simplest of the band leads instead (issue 36's rule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from meshplan.errors import SpecError
from meshplan.serve import check, weighed
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.estimate import ServeEstimate, serve_estimate
from meshplan.serve.memory import memory, weight_bytes
from meshplan.serve.metrics import Setting, deployment, instance
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.precision import Quant
from meshplan.serve.space import ServeSpace
from meshplan.specs.bands import serving_latency_error, serving_ranking_band
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.regime import Served, serving_regime

KEYS = ("tp", "pp", "dpa", "ep", "batch")


@dataclass(frozen=True)
class ServeSearchResult:
    """A serving search's answer: the feasible deployments best first, and what was evaluated and rejected."""

    model: ModelSpec
    cluster: Cluster
    space: ServeSpace
    plans: tuple[ServeEstimate, ...]  # feasible, best first
    evaluated: int
    feasible: int
    rejected: dict[str, int]
    examples: dict[str, str]
    seconds: float
    weighed: weighed.Weighed | None = None  # every configuration priced, with search(..., keep=True)
    band: float = 0.0  # the ranking's tie band (module docstring); 0: by the metric alone
    fastest: ServeEstimate | None = None  # the best by the metric alone (listed first only when the band allows)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def ttft_error(self) -> dict[str, object] | None:
        """Where a TTFT target filters: the serving model's TTFT error on published runs (runs, median, p90 of
        |error|, and on which GPUs), None without a target; {} where no published TTFT was evaluated."""
        if not self.space.ttft_slo:
            return None
        found, where = serving_latency_error(search_regime(self.model, self.cluster, self.space), "ttft")
        return {k: found[k] for k in ("runs", "median", "p90")} | {"runs_on": where} if found else {}

    def to_dict(self, price: float | None = None) -> dict[str, object]:
        return {"model": self.model.name, "system": self.cluster.name, "gpus": self.cluster.num_gpus,
                "input_len": self.space.input_len, "output_len": self.space.output_len,
                "cached_len": self.space.cached_len,
                "engine": self.space.engine.name, "ttft_slo_s": self.space.ttft_slo or None,
                "tpot_slo_s": self.space.tpot_slo or None, "evaluated": self.evaluated, "feasible": self.feasible,
                "rejected": {"count": self.rejected_total, "reasons": dict(self.rejected),
                             "examples": dict(self.examples)},
                "seconds": self.seconds, "tie_band": self.band or None, "ttft_error": self.ttft_error(),
                "fastest": self.fastest.to_dict(price) if self.fastest else None,
                "configurations_per_second": self.evaluated / self.seconds if self.seconds else None,
                "plans": [e.to_dict(price) for e in self.plans]}


def shapes(model: ModelSpec, cluster: Cluster, space: ServeSpace) -> dict[str, np.ndarray]:
    """Every instance shape and batch as columns: tp (powers of two up to max_tp), pp, and for a MoE data-parallel
    attention groups with experts split ep = tp·dpa ways, or tp-split experts (dpa = 1)."""
    n, rows = cluster.num_gpus, []
    tps = list(space.tp) or [t for t in (2**i for i in range(12)) if t <= min(space.max_tp, n)]
    pps = list(space.pp) or [p for p in (1, 2, 4, 8, 16) if p <= min(space.max_pp, model.num_layers)]
    dpas = list(space.dpa) or ([d for d in (2**i for i in range(12)) if d <= n] if model.is_moe else [1])
    for tp in tps:
        for pp in pps:
            for dpa in dpas:
                if tp * pp * dpa > n:
                    continue
                eps = [tp * dpa] if dpa > 1 else ([1, tp] if model.is_moe and tp > 1 else [1])
                rows += [(tp, pp, dpa, ep, b) for ep in eps for b in space.batches]
    cols = np.array(rows, dtype=np.int64).reshape(-1, len(KEYS))
    return {k: cols[:, i] for i, k in enumerate(KEYS)}


def no_instance(cluster: Cluster, space: ServeSpace) -> str:
    """Why no instance of the sizes ``space`` fixes fits the cluster (``shapes`` found none): an axis whose every
    size is above the GPU count, or the smallest product of the sizes given."""
    n, given = cluster.num_gpus, {k: getattr(space, k) for k in ("tp", "pp", "dpa") if getattr(space, k)}
    for k, sizes in given.items():
        if min(sizes) > n:
            return f"{k}={','.join(map(str, sizes))} exceeds gpus={n}"
    least = {k: min(given.get(k, (1,))) for k in ("tp", "pp", "dpa")}
    product = least["tp"] * least["pp"] * least["dpa"]
    return (f"tp·pp·dpa = {least['tp']}·{least['pp']}·{least['dpa']} = {product} at the least of the sizes given "
            f"exceeds gpus={n}")


def deployments(keys: dict[str, np.ndarray], num_gpus: int, disaggregate: bool) -> tuple[np.ndarray, ...]:
    """(key index, replicas, prefill replicas) of every deployment: the instances that fit the GPUs co-located,
    and each split of them into p prefill and n − p decode instances."""
    count = num_gpus // (keys["tp"] * keys["pp"] * keys["dpa"])
    splits = np.where(disaggregate, np.maximum(count - 1, 0), 0)
    per_key = 1 + splits
    index = np.repeat(np.arange(len(count)), per_key)
    offset = np.arange(len(index)) - np.repeat(np.cumsum(per_key) - per_key, per_key)  # 0 co-located, p = 1 …
    prefill = offset
    replicas = count[index] - prefill
    return index, replicas, prefill


def search(model: ModelSpec, cluster: Cluster, space: ServeSpace, top_k: int = 10,
           eff: ServeEfficiency = SERVE_DEFAULT, keep: bool = False) -> ServeSearchResult:
    """Every configuration of ``space``; the ``top_k`` feasible ones re-estimated (module docstring; 0: none, no
    plan listed and no band, for a caller that reads the ``weighed`` table alone). ``keep``: every configuration's
    figures too (``weighed``, for the report)."""
    start = time.perf_counter()
    check.servable(model)
    keys = shapes(model, cluster, space)
    if not len(keys["tp"]):
        raise SpecError(no_instance(cluster, space))
    workload = Workload(input_len=space.input_len, output_len=space.output_len, cached_len=space.cached_len)
    tally: dict[str, int] = {}
    examples: dict[str, str] = {}
    ranked: list[tuple[float, float, int, int, int, int]] = []  # (score, tiebreak, quant, key, replicas, prefill)
    evaluated, kept, pool = 0, [], []
    for qi, quant in enumerate(space.quants):
        index, replicas, prefill = deployments(keys, cluster.num_gpus, space.disaggregate)
        evaluated += len(index)
        bad, score, tiebreak, figures = _score(model, cluster, space, quant, keys, (index, replicas, prefill),
                                               workload, eff)
        if keep:
            kept.append(weighed.part(keys, qi, (index, replicas, prefill), bad, figures))
        for reason, mask in bad:
            hits = np.flatnonzero(mask)
            if len(hits):
                tally[reason] = tally.get(reason, 0) + len(hits)
                examples.setdefault(reason, _example(keys, quant, index, replicas, prefill, hits[0], mask))
        ok = np.flatnonzero(~np.any([m for _, m in bad], axis=0)) if bad else np.arange(len(index))
        best = ok[np.lexsort((tiebreak[ok], -score[ok]))][: 2 * top_k + 2]
        ranked += [(score[i], tiebreak[i], qi, index[i], replicas[i], prefill[i]) for i in best]
        pool.append((qi, ok, score, tiebreak, index, replicas, prefill))
    ranked.sort(key=lambda r: (-r[0], r[1]))
    # (no plan listed, no band: the error tables' file is not read)
    band = serving_ranking_band(search_regime(model, cluster, space)) if space.prefer_simple and top_k > 0 else 0.0
    rows = ranked[: 2 * top_k + 2] + _simple_rows(pool, keys, band, space, top_k) if top_k > 0 else []
    plans = [_estimate(model, cluster, space, keys, r, workload, eff) for r in dict.fromkeys(rows)]
    plans = _ordered([e for e in plans if e.fits and _meets(e, space)], space, band)
    fastest = min(plans, key=lambda e: _rank(e, space)) if plans else None
    return ServeSearchResult(model=model, cluster=cluster, space=space, plans=tuple(plans[:top_k]),
                             evaluated=evaluated, feasible=evaluated - sum(tally.values()), rejected=tally,
                             examples=examples, seconds=time.perf_counter() - start,
                             weighed=weighed.join(kept, space.quants) if keep else None, band=band, fastest=fastest)


def search_regime(model: ModelSpec, cluster: Cluster, space: ServeSpace) -> dict[str, str]:
    """The regime of the search's configurations (specs/regime.py): its engine on its GPUs, a batch of sequences,
    the weights spread over one node's GPUs (or the cluster's, if fewer)."""
    gpus = min(cluster.num_gpus, cluster.tiers[0].size if cluster.tiers else cluster.num_gpus)
    weights = weight_bytes(model, gpus, 1, 1, space.quants[0])
    return serving_regime(model, cluster, space.engine, Served(mode="saturated", batch=2.0, weights=float(weights),
                                                               input_len=space.input_len, output_len=space.output_len,
                                                               gpus=gpus))


def _score(model, cluster, space, quant, keys, deploy, workload, eff):
    """The reasons each deployment breaks (first one only), its ranking score and tiebreak, and its figures
    (weighed.FIGURES)."""
    index, replicas, prefill = deploy
    cols = {**keys, "replicas": np.ones_like(keys["tp"]), "prefill_replicas": np.zeros_like(keys["tp"])}
    structural = check.structural(model, cluster, cols, quant, space.engine)
    refused = check.refused_prompt(space.engine, workload)
    if refused:  # the engine refuses the prompts, whatever the configuration
        structural.append((refused, np.ones(np.shape(keys["tp"]), dtype=bool)))
    mem = memory(model, cluster.accelerator.hbm_bytes, cols, quant, space.engine,
                 space.engine.resident(workload))
    broken = np.any([np.broadcast_to(m, keys["tp"].shape) for _, m in structural], axis=0)
    with np.errstate(all="ignore"):
        one = instance(Setting(model, cluster, cols, quant, space.engine, workload, eff)) if not np.all(broken) \
            else None
    per_key = [(r, np.broadcast_to(m, keys["tp"].shape)) for r, m in structural]
    per_key.append((check.MEMORY, ~np.asarray(mem.fits)))
    shown = np.zeros(len(index), dtype=bool)
    bad = []
    for reason, mask in per_key:
        hit = mask[index] & ~shown
        bad.append((reason, hit))
        shown |= hit
    if one is None:
        nan = np.full(len(index), np.nan)
        return bad, np.zeros(len(index)), np.zeros(len(index)), dict.fromkeys(weighed.FIGURES, nan)
    picked = type(one)(*(np.asarray(v)[index] for v in vars(one).values()))
    with np.errstate(all="ignore"):
        m = deployment(picked, replicas, prefill, workload.output_len)
    for reason, slo, value in ((check.TTFT, space.ttft_slo, m.ttft), (check.TPOT, space.tpot_slo, m.tpot)):
        hit = (slo > 0) & ~(value <= slo) & ~shown
        bad.append((reason, hit))
        shown |= hit
    tokens = np.nan_to_num(np.asarray(m.tokens_per_s, dtype=float))
    figures = {"ttft": m.ttft, "tpot": m.tpot, "e2e": m.e2e, "tokens_per_s": m.tokens_per_s,
               "memory": np.asarray(mem.total)[index]}
    if space.rank_by == "latency":
        return bad, -np.nan_to_num(np.asarray(m.tpot, dtype=float), nan=np.inf), -tokens, figures
    return bad, tokens, np.nan_to_num(np.asarray(m.tpot, dtype=float), nan=np.inf), figures


def _quantised(quant: Quant) -> bool:
    """Whether ``quant`` leaves the checkpoint's 16 bits in any part."""
    return any(f not in ("bf16", "fp16") for f in (quant.weights, quant.activations, quant.kv_cache))


def _simplicity(tp, pp, dpa, ep, prefill, quantised: bool):
    """How much a configuration asks of its user (module docstring): of one (numbers) or many (arrays)."""
    axes = sum((np.asarray(v) > 1).astype(np.int64) for v in (tp, pp, dpa, ep))
    return axes + (np.asarray(prefill) > 0) + int(quantised)


def _inside(score, best: float, band: float, space: ServeSpace):
    """Which scores lie within the band of the best one: tokens/s at least best / (1 + b), or (ranking by latency,
    the score −TPOT) a TPOT at most (1 + b) times the best."""
    return score >= (best * (1 + band) if space.rank_by == "latency" else best / (1 + band))


def _simple_rows(pool, keys, band: float, space: ServeSpace, top_k: int) -> list[tuple]:
    """The rows (as ``search`` ranks them) of the first 2·top_k + 2 configurations within the band of the best
    score, simplest first, then on fewer GPUs, then by score: the candidates the estimates re-rank."""
    tops = [float(score[ok].max()) for _, ok, score, *_ in pool if len(ok)]
    if not band or not tops:
        return []
    out = []
    for qi, ok, score, tiebreak, index, replicas, prefill in pool:
        i = ok[_inside(score[ok], max(tops), band, space)]
        k = index[i]
        simple = _simplicity(keys["tp"][k], keys["pp"][k], keys["dpa"][k], keys["ep"][k], prefill[i],
                             _quantised(space.quants[qi]))
        gpus = keys["tp"][k] * keys["pp"][k] * keys["dpa"][k] * (replicas[i] + prefill[i])
        order = np.lexsort((-score[i], gpus, simple))[: 2 * top_k + 2]
        out += [(simple[j], gpus[j], (score[i][j], tiebreak[i][j], qi, k[j], replicas[i][j], prefill[i][j]))
                for j in order]
    out.sort(key=lambda r: (r[0], r[1], -r[2][0]))
    return [r[2] for r in out[: 2 * top_k + 2]]


def _ordered(plans: list[ServeEstimate], space: ServeSpace, band: float) -> list[ServeEstimate]:
    """The estimates in the search's order (module docstring): the best, then the rest of its band, simplest first."""
    by_rank = sorted(plans, key=lambda e: _rank(e, space))
    if not band or not by_rank:
        return by_rank
    best = _rank(by_rank[0], space)[0]
    close = [e for e in by_rank if _inside(-_rank(e, space)[0], -best, band, space)]  # the score: −(rank's first)
    close.sort(key=lambda e: (int(_simplicity(e.plan.tp, e.plan.pp, e.plan.dpa, e.plan.ep, e.plan.prefill_replicas,
                                               _quantised(e.plan.quant))), e.plan.num_gpus, _rank(e, space)))
    if not space.simplest_leads:
        close = [by_rank[0], *(e for e in close if e is not by_rank[0])]
    chosen = {id(e) for e in close}
    return close + [e for e in by_rank if id(e) not in chosen]


def _plan(keys, quant: Quant, i: int, replicas: int, prefill: int) -> ServePlan:
    return ServePlan(**{k: int(keys[k][i]) for k in KEYS}, replicas=int(replicas), prefill_replicas=int(prefill),
                     quant=quant)


def _example(keys, quant, index, replicas, prefill, j, mask) -> str:
    return _plan(keys, quant, index[j], replicas[j], prefill[j]).describe()


def _estimate(model, cluster, space, keys, row, workload, eff) -> ServeEstimate:
    _, _, qi, i, replicas, prefill = row
    plan = _plan(keys, space.quants[qi], i, replicas, prefill)
    return serve_estimate(model, cluster, plan, workload, space.engine, eff)


def _meets(e: ServeEstimate, space: ServeSpace) -> bool:
    m = e.metrics
    return bool((not space.ttft_slo or m.ttft <= space.ttft_slo) and (not space.tpot_slo or m.tpot <= space.tpot_slo))


def _rank(e: ServeEstimate, space: ServeSpace) -> tuple:
    m = e.metrics
    if space.rank_by == "latency":
        return (m.tpot, -m.tokens_per_s)
    return (-m.tokens_per_s, m.tpot, e.plan.num_gpus)
