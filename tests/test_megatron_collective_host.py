"""A tensor-parallel collective of Megatron-LM's 2020-22 module code (the validation profile megatron-lm-2021 of
meshplan_validation/sources.py, and the Megatron-LM CI 2024 profile built on it) costs the host one c10d call, not a
kernel of that module code (issue 79, the Hopper and Ampere Megatron bands): megatron/core/tensor_parallel/
mappings.py ``_reduce`` (megatron/mpu/mappings.py before the core split) is one ``torch.distributed.all_reduce``, and
counted on CPU the same layer (Megatron-DeepSpeed's copy of it) at tp 2 makes tp 1's Python calls and aten ops plus
its 4 all-reduces (data/measured/2026-11-27-megatron-host-cpu-tp.json), so the stack takes the megatron-deepspeed
preset's price of that call (14.5 us: specs/host_cost.py EAGER_OP_HOST), not the 50 us a kernel of the layer's module
Python averages (sources.MEGATRON_LM_HOST)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cost.layers import dense_layer
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.host_cost import EAGER_OP_HOST
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.host import host_times
from meshplan_validation.sources import MEGATRON_2021, MEGATRON_LM_COLLECTIVE, MEGATRON_LM_HOST

ROOT = Path(__file__).resolve().parents[1]
US = 1e-6
# the Megatron-LM CI's GPT case (data/validation/small_work.jsonl: hidden 512, 12 layers, 8 heads, sequence 1024,
# Megatron's biases, dropout and learned positions)
CI_GPT = ModelSpec(name="gpt-ci", num_layers=12, hidden_size=512, num_heads=8, ffn_hidden_size=2048,
                   vocab_size=50257, seq_length=1024, mlp="gelu", norm="layernorm", position_embedding="learned",
                   max_position_embeddings=1024, tied_embeddings=True, qkv_bias=True, linear_bias=True, dropout=True)


def _plan(tp: int, pp: int = 1) -> Plan:
    return Plan(tp=tp, pp=pp, dp=8 // (tp * pp), micro_batch=4, global_batch=32, sequence_parallel=False)


def test_the_measured_layer_adds_all_reduce_calls_and_no_module_python():
    measured = json.loads((ROOT / "data/measured/2026-11-27-megatron-host-cpu-tp.json").read_text())
    tp1, tp2 = measured["median"]["1"], measured["median"]["2"]
    assert tp2["python_calls"] <= tp1["python_calls"] and tp2["aten_ops"] <= tp1["aten_ops"]
    assert measured["ops_differing"]["c10d.allreduce_.default"] == {"1": 0.0, "2": 4.0}
    assert MEGATRON_LM_COLLECTIVE == load_stack("megatron-deepspeed").collective_host == EAGER_OP_HOST
    assert round(MEGATRON_LM_COLLECTIVE / US, 9) == 14.5
    assert MEGATRON_2021.host.per_call(collective=True) == MEGATRON_LM_COLLECTIVE
    assert MEGATRON_2021.host.per_call(collective=False) == MEGATRON_LM_HOST
    assert round(MEGATRON_LM_HOST / US, 9) == 50.0


@pytest.mark.parametrize("tp", [2, 4])
def test_a_ci_layer_s_host_time_is_its_kernels_plus_its_all_reduce_calls(tp):
    """One layer per micro-batch: forward 15 kernels x 50 us = 750 us and backward 44 x 50 = 2200 us at tp 1; at tp 2
    and 4 the same kernels and 2 all-reduces a pass (the attention's and the MLP's output forward, their inputs'
    gradients backward): 750 + 2 x 14.5 = 779 us and 2200 + 29 = 2229 us (at a kernel's 50 us each: 850 / 2300)."""
    host = MEGATRON_2021.host
    one = host_times(dense_layer(CI_GPT, _plan(1), MEGATRON_2021), _plan(1), host, "none")
    assert (one["f"] / US, one["b"] / US) == pytest.approx((750.0, 2200.0))
    many = host_times(dense_layer(CI_GPT, _plan(tp), MEGATRON_2021), _plan(tp), host, "none")
    assert (many["f"] / US, many["b"] / US) == pytest.approx((779.0, 2229.0))
    as_kernel = MEGATRON_2021.with_(collective_host=0.0).host
    old = host_times(dense_layer(CI_GPT, _plan(tp), MEGATRON_2021), _plan(tp), as_kernel, "none")
    assert (old["f"] / US, old["b"] / US) == pytest.approx((850.0, 2300.0))


@pytest.mark.parametrize(("system", "tp", "pp"), [("h100", 1, 1), ("h100", 2, 2), ("h100", 4, 1), ("a100", 4, 1),
                                                  ("a100", 2, 2), ("a100", 8, 1)])
def test_a_dearer_collective_call_never_shortens_the_step(system, tp, pp):
    """Monotone: the step is non-decreasing in the host's price of a collective call, and at tp 1 (no collective
    over more than one rank in the layers) it does not move at all."""
    cluster = load_system(system).cluster(8)
    steps = [estimate(CI_GPT, cluster, _plan(tp, pp), MEGATRON_2021.with_(collective_host=c * US)).step_time
             for c in (0.5, 5.0, 14.5, 30.0, 50.0, 200.0)]
    assert all(b >= a - 1e-12 for a, b in zip(steps, steps[1:], strict=False))
    if tp == 1:
        assert steps[0] == pytest.approx(steps[-1], rel=1e-12)
    else:
        assert steps[-1] > steps[0]
