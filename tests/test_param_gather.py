"""The distributed optimizer's weight all-gather left synchronous (Stack.overlap_param_gather off: Megatron-Core's
DistributedOptimizer.step_with_ready_grads gathers every chunk right after the optimizer step), and the Megatron-Bridge
25.11 MXFP8 recipes that leave it so (recipes_off.PARAM_GATHER_OFF)."""

from __future__ import annotations

import pytest

from meshplan.cost.fsdp import lead_times
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import _pass
from meshplan_validation.case import map_run
from published_helpers import record

SD = 0.189  # the overlap slowdown (efficiency.py, Lee et al. 2025)
LLAMA31_405B = {"name": "Llama3.1-405B", "arch": "dense", "num_layers": 126, "hidden_size": 16384,
                "num_heads": 128, "num_kv_heads": 8, "ffn_hidden_size": 53248, "vocab_size": 128000,
                "seq_length": 8192}


def test_a_synchronous_gather_is_the_first_forward_pass_s_lead():
    model, plan = load_model("llama3-70b"), Plan(dp=8, tp=4, pp=4, global_batch=256)
    stack = load_stack("megatron-bridge")
    # overlapped (the default, nothing drained): no lead; left synchronous: the whole gather, and no backward lead
    assert lead_times(model, plan, stack, 0.25, lambda n: 1.0) == (0.0, 0.0)
    assert lead_times(model, plan, stack.with_(overlap_param_gather=False), 0.25, lambda n: 1.0) == (0.25, 0.0)


@pytest.mark.parametrize(("zero", "drained", "leads"), [
    (2, "none", (0.25, 0.0)),  # ZeRO-2's distributed optimizer gathers after the step too
    (3, "none", (0.0, 0.0)),  # ZeRO-3 gathers beside every forward (zero_traffic): the flag changes nothing here
    (1, "forward", (0.25, 0.0)),  # drained: max(the whole 0.25, min(0.25, root 1 + layer 1)) = 0.25
    (1, "both", (0.25, 0.25)),  # and the backward's drained lead, min(0.25, the last layer's 1)
])
def test_a_synchronous_gather_is_the_whole_gather_at_zero_1_and_2_drained_or_not(zero, drained, leads):
    model, plan = load_model("llama3-70b"), Plan(dp=8, tp=4, pp=4, global_batch=256, zero=zero)
    stack = load_stack("megatron-bridge").with_(overlap_param_gather=False, drained_passes=drained)
    assert lead_times(model, plan, stack, 0.25, lambda n: 1.0) == leads
    # with the gather overlapped, a drained forward's lead is its first units' alone: min(0.25, 0.1 + 0.1) = 0.2
    overlapped = lead_times(model, plan, stack.with_(overlap_param_gather=True), 0.25, lambda n: 0.1)
    assert overlapped[0] == (pytest.approx(0.2) if drained != "none" else 0.0)


def test_the_first_forward_pass_waits_for_the_whole_gather():
    # the first forward pass of a step: T' = 0.05 s of compute (K = 0.05 s, no layer traffic), D = 0.156 s gather.
    # Overlapped it hides 0.05 s: max(0, D - T') = 0.106 s exposed, plus the slowdown of the 0.05 s of compute it
    # overlaps, 0.189 * 0.05 = 0.00945 s: 0.11545 s. Synchronous (lead = D): max(D, D - T') = 0.156 s, + 0.00945 s
    overlapped, _ = _pass(0.05, 0.05, 0.0, 0.156, 0.0, 1.0, SD, True)
    synchronous, _ = _pass(0.05, 0.05, 0.0, 0.156, 0.0, 1.0, SD, True, lead=0.156)
    assert overlapped == pytest.approx(0.106 + 0.00945)
    assert synchronous == pytest.approx(0.156 + 0.00945)


@pytest.mark.parametrize(("system", "n", "plan"), [
    ("h100", 64, Plan(dp=2, tp=4, pp=8, vpp=5, global_batch=128)),
    ("b200", 128, Plan(dp=2, tp=4, pp=8, cp=2, vpp=4, global_batch=64)),
    ("h100", 16, Plan(dp=16, global_batch=64, zero=2)),
    ("h100", 16, Plan(dp=16, global_batch=64, zero=0)),  # no gather at ZeRO-0: the flag changes nothing
])
def test_a_synchronous_gather_never_shortens_the_step_and_only_adds_data_parallel_time(system, n, plan):
    model, cluster = load_model("llama3-70b"), load_system(system).cluster(n)
    stack = load_stack("megatron-bridge")
    on = estimate(model, cluster, plan, stack)
    off = estimate(model, cluster, plan, stack.with_(overlap_param_gather=False))
    assert off.step_time >= on.step_time
    assert {k: v for k, v in off.breakdown.items() if k != "dp"} == {k: v for k, v in on.breakdown.items()
                                                                      if k != "dp"}
    if plan.zero == 0:
        assert off.step_time == on.step_time
    # without overlap_dp every DP collective runs after the passes anyway: the flag changes nothing
    plain = stack.with_(overlap_dp=False)
    assert estimate(model, cluster, plan, plain).step_time == estimate(
        model, cluster, plan, plain.with_(overlap_param_gather=False)).step_time


@pytest.mark.parametrize(("group", "model", "gpu", "precision", "synchronous"), [
    # v0.2.0-v0.2.2 llama31_llm_pretrain.py / llama3_llm_pretrain.py: fp8_mx -> overlap_param_gather = False
    ("megatron_bridge_25.11", LLAMA31_405B, "B200", "mxfp8", True),
    ("megatron_bridge_25.11", LLAMA31_405B, "GB200", "mxfp8", True),
    ("megatron_bridge_25.11_blackwell_ultra", LLAMA31_405B, "GB300", "mxfp8", True),
    ("megatron_bridge_25.11", None, "GB200", "mxfp8", True),  # Llama3-70B
    ("megatron_bridge_25.11", LLAMA31_405B, "B200", "fp8", False),  # FP8-CS keeps the overlap
    ("megatron_bridge_25.11", None, "H100", "fp8", False),
    ("megatron_bridge_25.09", LLAMA31_405B, "B200", "mxfp8", False),  # the 25.09 scripts do not set it
    ("megatron_bridge_26.02", LLAMA31_405B, "GB200", "mxfp8", False),  # nor the 26.02 ones (v0.3.0)
    # v0.5.0 (26.06): the GB200 NVFP4 V2 recipe calls disable_param_gather_overlap; 26.04's (v0.4.0) does not
    ("megatron_bridge_26.06", LLAMA31_405B, "GB200", "nvfp4", True),
    ("megatron_bridge_26.04", LLAMA31_405B, "GB200", "nvfp4", False),
    ("megatron_bridge_26.06", LLAMA31_405B, "GB200", "mxfp8", False),
])
def test_the_25_11_mxfp8_recipes_leave_the_weight_gather_synchronous(group, model, gpu, precision, synchronous):
    over = {"model": model} if model else {}
    case = map_run(record(group=group, precision=precision, **over,
                          hardware={"gpu": gpu, "num_gpus": 128, "gpus_per_node": 8 if gpu[0] != "G" else 4},
                          parallel={"tp": 4, "pp": 8, "cp": 2 if model else 1, "vp": 8 if model else 5,
                                    "micro_batch_size": 1, "global_batch_size": 64}))
    assert case.stack.overlap_param_gather is (not synchronous)
    assert any("weight all-gather after the optimizer step" in a for a in case.assumptions) is synchronous


def test_an_emitted_megatron_config_says_the_gather_is_not_overlapped():
    from meshplan.configs.megatron import _stack_args

    plan, stack = Plan(dp=8, tp=4, zero=1, global_batch=64), load_stack("megatron-bridge")
    assert ("--overlap-param-gather", True) in _stack_args(stack, plan)
    assert ("--overlap-param-gather", False) in _stack_args(stack.with_(overlap_param_gather=False), plan)


# ---- a record that states its Megatron-LM arguments: read as Megatron-LM reads them (configs/megatron_rules) ---------
def _records(path: str) -> dict[str, dict]:
    from pathlib import Path

    from meshplan_validation.records import read_runs
    return {r["id"]: r for r in read_runs(Path(__file__).parents[1] / path)}


@pytest.mark.parametrize(("stated", "overlapped"), [
    ("--use-distributed-optimizer --overlap-grad-reduce", False),  # store_true: off unless given
    ("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather", True),
    ("Megatron distributed optimizer (--overlap-param-gather)", True),
])
def test_a_record_s_stated_arguments_read_as_megatron_lm_reads_them(stated, overlapped):
    from meshplan.configs.megatron_rules import dp_overlaps
    from meshplan_validation.map_kernels import stated_arguments

    rec = record(group="paper", framework="Megatron-LM", parallel={"tp": 4, "pp": 8, "vp": 5, "zero_or_fsdp": stated})
    case = map_run(rec)
    assert case.plan.zero == 1 and case.stack.overlap_dp
    # the one reading the config reader (configs/megatron.py) and the validation layer share
    assert case.stack.overlap_param_gather is dp_overlaps(stated_arguments(rec))["overlap_param_gather"] is overlapped
    noted = [a for a in case.assumptions if "weight all-gather after the optimizer step" in a]
    assert noted == ([] if overlapped else
                     ["weight all-gather after the optimizer step, before the first forward pass (stated arguments "
                      "without --overlap-param-gather)"])


def test_a_flag_listed_as_left_out_is_not_given():
    from meshplan_validation.map_kernels import stated_arguments

    assert stated_arguments({"parallel": {"zero_or_fsdp": "no --overlap-param-gather, plus --overlap-grad-reduce"}}
                            ) == {"--overlap-grad-reduce"}


def test_the_records_that_state_their_arguments():
    """Megatron-LM's CI of February 2024 ran `--use-distributed-optimizer --overlap-grad-reduce` (its ADDITIONAL_PARAMS)
    without --overlap-param-gather, a store_true flag then too (megatron/arguments.py:1130-1131 @ 6aad2116): the
    distributed optimizer gathered the weights in its step. Megatron-Core 0.8's README runs state both flags, and so
    on; a Megatron-Bridge table states none, and its recipe's value stands."""
    small, published = _records("data/validation/small_work.jsonl"), _records("data/validation/published_runs.jsonl")
    for gpu in ("h100", "a100"):
        case = map_run(small[f"megatron_ci_gpt_h512_l12_tp1_pp1_dp8_mbs4_gbs32_distopt_ogr_8x{gpu}"])
        assert (case.plan.zero, case.stack.overlap_dp, case.stack.overlap_param_gather) == (1, True, False)
        # the same runs without the distributed optimizer: no weight gather, so the flag changes nothing
        ogr = map_run(small[f"megatron_ci_gpt_h512_l12_tp1_pp1_dp8_mbs4_gbs32_ogr_8x{gpu}"])
        assert (ogr.plan.zero, ogr.stack.overlap_param_gather) == (0, False)
    assert map_run(published["mcore_h100_weak_70B"]).stack.overlap_param_gather
    assert map_run(record()).stack.overlap_param_gather  # no arguments stated: Megatron-Bridge 26.04's recipe
