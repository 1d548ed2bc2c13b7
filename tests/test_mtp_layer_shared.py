"""A multi-token-prediction depth's layer takes the pass times of the layers of its kind (step/units._kind): the same
records and times, priced once per recompute mode, unless a compiled stack's host pays per region (``region``, which
the layers are and the depth's layer is not). The head unit is the same, bit for bit, as pricing the depth's layer
on its own (the formula units._head_and_mtp states)."""

from __future__ import annotations

import numpy as np
import pytest

import meshplan.step.units as units_module
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.passes import PassTimes, pass_times
from meshplan.step.units import timed_parts, units_for_recomputes

MODES = ("none", "selective", "full")
CASES = [("deepseek-v3", Plan(tp=4, pp=4, ep=8, etp=1, dp=16, global_batch=256)),  # mtp_kinds ("moe",)
         ("nemotron-3-super", Plan(tp=4, pp=2, ep=8, etp=1, dp=32, global_batch=256))]  # ("attention", "moe")
STACKS = {"plain": load_stack("megatron-core"),
          # a region's host time long enough that the host binds a layer's passes: region True and False differ
          "compiled": load_stack("torchtitan").with_(compiled=True, region_host=0.05)}


def _bits(p: PassTimes) -> list[bytes]:
    return [np.asarray(getattr(p, f), dtype=np.float64).tobytes() for f in PassTimes.__slots__]


def _head_alone(model, plan, stack, parts, recompute) -> PassTimes:
    """The head unit with every MTP depth's layer priced by its own ``pass_times`` call (region False)."""
    head = pass_times(parts.ops["head"], parts.times["head"], plan, stack, "none", DEFAULT)
    full = recompute == "full"
    depth = pass_times(parts.ops["mtp"], parts.times["mtp"], plan, stack, "full" if full else "none",
                       DEFAULT).plus(head)
    for kind in model.mtp_kinds:
        depth = depth.plus(pass_times(parts.ops[kind], parts.times[kind], plan, stack, recompute, DEFAULT))
    return head.plus(depth.scaled(model.mtp_layers))


@pytest.mark.parametrize("stack_name", list(STACKS))
@pytest.mark.parametrize(("name", "plan"), CASES)
def test_the_head_unit_is_the_depths_layer_priced_alone(name, plan, stack_name):
    model, stack = load_model(name), STACKS[stack_name]
    cluster = load_system("h100").cluster(plan.num_gpus)
    parts = timed_parts(model, cluster, plan, stack, DEFAULT)
    units = units_for_recomputes(model, plan, stack, parts, MODES)
    hosted = units_module.on_host(stack, parts.python_host)
    for rc in MODES:
        assert _bits(units[rc].head) == _bits(_head_alone(model, plan, hosted, parts, rc))
    kind = model.mtp_kinds[-1]
    as_region, alone = (pass_times(parts.ops[kind], parts.times[kind], plan, hosted, "none", DEFAULT, region)
                        for region in (True, False))
    assert (as_region.host > alone.host) == (stack_name == "compiled")  # the region is read where compiled alone


@pytest.mark.parametrize(("name", "plan"), CASES)
def test_the_layers_pass_times_are_reused_unless_the_region_is_read(name, plan, monkeypatch):
    """Calls of pass_times for one plan's units under three recompute modes: the layer kinds (k of them) once per
    mode (none, selective, full: 3k), the embedding, the send, the head and the MTP depth's own ops under full
    recompute and not (5); the depth's layer kinds (m) are among the layers' ((3k + 5) in all), unless the stack is
    compiled, where a region is priced apart (3m more)."""
    model = load_model(name)
    cluster = load_system("h100").cluster(plan.num_gpus)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return pass_times(*args, **kwargs)

    monkeypatch.setattr(units_module, "pass_times", counted)
    k, m = len(model.block_counts), len(model.mtp_kinds)
    for stack_name, extra in (("plain", 0), ("compiled", 3 * m)):
        stack = STACKS[stack_name]
        parts = timed_parts(model, cluster, plan, stack, DEFAULT)
        units_module._UNITS.clear()
        calls.clear()
        units_for_recomputes(model, plan, stack, parts, MODES)
        assert len(calls) == 3 * k + 5 + extra
