"""The step is composed once (step.assemble.compose, compose_memory): the search's float32 grid of every setting and
estimate()'s step for one plan under one setting are the same composition, so they agree to float32 rounding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.estimate import estimate
from meshplan.search.batch import PlanBatch
from meshplan.search.scoring import grid_memory, grid_times
from meshplan.search.space import Space
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.assemble import step_costs
from meshplan.step.memory_grid import compose_memory
from meshplan.step.units import unit_costs
from spaces import EVERY_PLAN


def test_the_search_grid_is_estimate_s_step_under_every_setting():
    """Three plans of llama3-8b on 64 H100s (1F1B with p = 4, interleaved, one stage) under the whole grid: 3
    recompute modes x 4 ZeRO stages x 2 x 2 offloads = 48 settings each, every one equal to step_costs() of the
    plan with that setting (float64) within float32 rounding, time, peak HBM and host bytes alike."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(64)
    plans = [Plan(dp=8, tp=2, pp=4, global_batch=64, sequence_parallel=True),
             Plan(dp=4, tp=4, pp=4, vpp=2, schedule="interleaved", global_batch=64, sequence_parallel=True),
             Plan(dp=16, tp=4, pp=1, global_batch=64, sequence_parallel=True)]
    space = Space(global_batch=64, **EVERY_PLAN)  # every ZeRO stage and offload (tests/spaces.py)
    checked = 0
    for plan in plans:
        batch = PlanBatch.of([plan])
        units = {rc: unit_costs(model, cluster, replace(batch, recompute=rc), space.stack, DEFAULT)
                 for rc in space.recompute}
        times = grid_times(model, cluster, batch, units, space, DEFAULT)
        peak, host = grid_memory(model, batch, units, space)
        assert times.shape == peak.shape == host.shape == (3, 4, 2, 2, 1)
        assert len(np.unique(times)) > 24  # the settings matter: the grid is not a few numbers repeated
        for (r, z, o, a), t in np.ndenumerate(times[..., 0]):
            settings = dict(recompute=space.recompute[r], zero=space.zero[z],
                            offload_optimizer=space.offload_optimizer[o],
                            offload_activations=space.offload_activations[a])
            one = step_costs(model, cluster, replace(plan, **settings), space.stack)
            assert t == pytest.approx(float(one.step_time), rel=1e-6), settings
            assert peak[r, z, o, a, 0] == pytest.approx(float(one.peak_memory), rel=1e-6), settings
            assert host[r, z, o, a, 0] == pytest.approx(float(one.host_memory), rel=1e-6, abs=1.0), settings
            checked += 1
    assert checked == 3 * 48


def test_the_search_reads_estimate_s_peak_where_the_loss_leaves_a_hole():
    """torchtitan's Llama 3 8B at FSDP 8 under per-op SAC (tp 1, the upcast eager loss under expandable segments:
    step/memory.logits_hole 3.91 GiB): the search's float32 peak of the plan under its own settings is estimate()'s
    peak_memory, the allocated peak it checks against the HBM (estimate.fits); the hole, carried in the grid's
    activations as Phases' fourth field, is only in estimate()'s reserved_memory (MemoryGrid.peak reads kept, loss
    and working), never in what the search ranks or refuses on."""
    model, cluster, stack = load_model("llama3-8b"), load_system("h100").cluster(8), load_stack("torchtitan")
    plan = Plan(dp=8, zero=3, micro_batch=2, global_batch=16, recompute="selective", recompute_modules=("op_sac",))
    space = Space(global_batch=16, stack=stack, zero=(3,), recompute=("selective",), offload_optimizer=(False,),
                  offload_activations=(False,))
    batch = PlanBatch.of([plan])
    units = {"selective": unit_costs(model, cluster, batch, stack, DEFAULT)}
    peak, _ = grid_memory(model, batch, units, space)
    est = estimate(model, cluster, plan, stack)
    assert peak.shape == (1, 1, 1, 1, 1)
    assert peak[0, 0, 0, 0, 0] == pytest.approx(est.peak_memory, rel=1e-6)
    hole = compose_memory(model, batch, units, space, stack).activations[0, 0, 0, 3]
    assert hole == pytest.approx(16384 * 128256 * 2)  # 2N = 2 x 16,384 x 128,256: no free tail under per-op SAC
    assert est.reserved_memory - est.peak_memory > hole > 0


def test_grid_times_composes_the_wanted_settings_alone_to_the_same_numbers():
    """search/scoring.grid_times(wanted): only the recompute modes and activation offloads of a wanted setting are
    composed (step/grid.some_settings), each the same float32 number, bit for bit, as in the whole grid; the modes
    and offloads of no wanted setting are NaN. Wanted here: selective recompute without activation offload at ZeRO 1,
    and full recompute with it at ZeRO 3, so the composed settings are those two modes under both offloads."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(64)
    plan = Plan(dp=8, tp=2, pp=4, global_batch=64, sequence_parallel=True)
    space = Space(global_batch=64, **EVERY_PLAN)
    batch = PlanBatch.of([plan])
    units = {rc: unit_costs(model, cluster, replace(batch, recompute=rc), space.stack, DEFAULT)
             for rc in space.recompute}
    whole = grid_times(model, cluster, batch, units, space, DEFAULT)
    wanted = np.zeros(whole.shape[:4], dtype=bool)
    sel, full = space.recompute.index("selective"), space.recompute.index("full")
    wanted[sel, space.zero.index(1), 0, space.offload_activations.index(False)] = True
    wanted[full, space.zero.index(3), 0, space.offload_activations.index(True)] = True
    some = grid_times(model, cluster, batch, units, space, DEFAULT, wanted)
    composed = np.zeros(whole.shape, dtype=bool)
    composed[[sel, full]] = True  # both modes, under both offloads (the two axes compose's loops run over)
    assert np.array_equal(some[composed], whole[composed])
    assert np.isnan(some[~composed]).all() and not np.isnan(whole).any()
