"""The step is composed once (step.assemble.compose, compose_memory): the search's float32 grid of every setting and
estimate()'s step for one plan under one setting are the same composition, so they agree to float32 rounding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.search.batch import PlanBatch
from meshplan.search.scoring import grid_memory, grid_times
from meshplan.search.space import Space
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.step.assemble import step_costs
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
