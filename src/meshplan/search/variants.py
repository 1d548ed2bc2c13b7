"""Framework switches searched as plan choices (issue 84 item 4): a switch of the software stack that moves a plan's
time by a factor, searched beside the parallel layout where the framework has it. The MoE experts' GEMMs: per expert
(a kernel each, launched by the host after the tokens-per-expert sync) or grouped (one kernel for every local expert:
Megatron-Core --moe-grouped-gemm, which Megatron-Bridge's MoE recipes turn on). With 512 experts of Qwen3-Next on one
GPU (ep 1), per-expert launches price a step 25x a grouped one; the search's plans avoid such layouts under per-expert
GEMMs, and a grouped one opens them again.

Each choice (``Space.expert_gemms``, narrowed to the framework's ``Supports.expert_gemms``) is a search of its own on
the stack with that switch; the one whose fastest plan is fastest is returned, its counts those of every search (the
others' plans are not kept: run.fastest_searches).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from meshplan.search.run import SearchResult, fastest_searches, search
from meshplan.search.space import Space, switch_spaces
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


def search_switches(model: ModelSpec, cluster: Cluster, space: Space, top_k: int = 10, eff: Efficiency = DEFAULT,
                    progress: Callable[[int, int], None] | None = None, explore: Any = None) -> SearchResult:
    """``search`` over every choice of ``space.expert_gemms`` for a MoE model (module docstring); the plain search
    otherwise."""
    spaces = switch_spaces(model, space)
    if len(spaces) < 2:
        return search(model, cluster, spaces[0], top_k=top_k, eff=eff, progress=progress, explore=explore)
    start = time.perf_counter()  # the searches' jobs run in one pool of processes (run.fastest_searches)
    results = fastest_searches(model, cluster, spaces, top_k=top_k, eff=eff, progress=progress, explore=explore)
    found = [r for r in results if r.fastest is not None]
    best = min(found, key=lambda r: r.fastest.step_time if r.fastest else 0.0) if found else results[0]
    rejected = sum((Counter(r.rejected) for r in results), Counter())
    return replace(best, evaluated=sum(r.evaluated for r in results), feasible=sum(r.feasible for r in results),
                   bounded=sum(r.bounded for r in results), rejected=dict(rejected),
                   seconds=time.perf_counter() - start)
