"""The "device" memory counter (meshplan/step/device_memory.py, Estimate.device_memory): what nvidia-smi reads of a
training process, the caching allocator's reserved bytes plus the CUDA context with its kernels and NCCL's buffers
per communicator (issue 79: BLOOM's memory column is nvidia-smi's, and read as the reserved peak its 30 runs were
9-30 % light for all but six)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.device_memory import beyond_reserved, communicators, nccl_bytes
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case, peak_read
from meshplan_validation.records import read_runs

ROOT = Path(__file__).resolve().parents[1]
A100 = load_system("a100").accelerator


def test_one_gpu_holds_its_own_cuda_context_and_no_communicator():
    # the hardware preset's measurement: BigScience's 1573 MiB on an A100, 1271 MiB on its V100s
    assert communicators(Plan()) == ()
    assert beyond_reserved(Plan(), A100) == 1573 * 2**20
    assert beyond_reserved(Plan(), load_system("v100").accelerator) == 1271 * 2**20


def test_a_gpu_measured_by_no_source_takes_a100s_figures():
    # no CUDA-context or NCCL-buffer reading of an H100 is known: Accelerator's defaults, which are A100's presets'
    a100, h100, plan = load_system("a100-40gb").accelerator, load_system("h100").accelerator, Plan(dp=4, tp=8, pp=2)
    for acc in (A100, h100):
        assert (acc.cuda_context, acc.nccl_pair, acc.nccl_group) == (a100.cuda_context, a100.nccl_pair, a100.nccl_group)
    assert beyond_reserved(plan, h100) == beyond_reserved(plan, A100)
    # a V100 has its own context but A100's NCCL buffers: the same communicators cost the same
    v100 = load_system("v100").accelerator
    assert beyond_reserved(plan, v100) - beyond_reserved(plan, A100) == pytest.approx((1271 - 1573) * 2**20)


def test_bloom_first_stage_by_hand():
    # tp 8, pp 12, dp 4 (BLOOM's 0221 runs): TP (8), data-parallel (4), the next stage's pair (2), the model-parallel
    # group over which the gradient norm is reduced (8 x 12 = 96): three of more than two GPUs and one pair
    plan = Plan(dp=4, tp=8, pp=12, global_batch=2048)
    assert communicators(plan) == (8, 4, 2, 96)
    assert nccl_bytes(communicators(plan), A100) == pytest.approx(3 * 688e6 + 544e6)
    assert beyond_reserved(plan, A100) == pytest.approx(1573 * 2**20 + 2.608e9)


def test_a_tied_head_adds_the_ends_pair():
    # BLOOM ties its head to the word embedding: DeepSpeed's PipelineModule all-reduces the tied gradient between the
    # first and the last stage in a two-rank group of its own, one more pair (544 MB) on a first-stage GPU; not under
    # LoRA (the embedding trains nothing) nor without a pipeline (both ends on one rank)
    model = load_model("bloom-176b")
    assert model.tied_embeddings
    plan = Plan(dp=4, tp=8, pp=12, global_batch=2048)
    assert communicators(plan, model) == (8, 4, 2, 96, 2)
    assert beyond_reserved(plan, A100, model) - beyond_reserved(plan, A100) == pytest.approx(544e6)
    assert communicators(replace(plan, finetune="lora"), model) == (8, 4, 2, 96)
    assert communicators(Plan(dp=4, tp=8, global_batch=2048), model) == (8, 4, 8)


SIZES = (1, 2, 4, 8)


@pytest.mark.parametrize(("axis", "tp", "pp", "dp", "cp"),
                         [(a, *s) for a in ("tp", "pp", "dp", "cp") for s in itertools.product(SIZES, repeat=4)][::7])
def test_more_ranks_on_an_axis_never_shrink_the_device_reading(axis, tp, pp, dp, cp):
    """A larger group on any axis makes a communicator where there was none, or a larger one: never less memory
    (a pair's 544 MB at most the 688 MB of a larger group, NVIDIA/nccl#964), and the context stays."""
    base = Plan(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=1024)
    grown = replace(base, **{axis: 2 * getattr(base, axis)})
    assert beyond_reserved(grown, A100) >= beyond_reserved(base, A100) >= A100.cuda_context
    assert len(communicators(grown)) >= len(communicators(base))


def test_each_communicator_adds_its_size_class():
    # (8, 4, 2, 96): a group, a group, a pair, a group: 688, 688, 544, 688 MB on an A100
    groups = (8, 4, 2, 96)
    steps = [nccl_bytes(groups[: k + 1], A100) - nccl_bytes(groups[:k], A100) for k in range(len(groups))]
    assert steps == pytest.approx([688e6, 688e6, 544e6, 688e6])


def test_the_device_reading_is_the_reserved_peak_and_what_lies_beside_it():
    model, cluster = load_model("llama3-8b"), load_system("a100").cluster(64)
    plan = Plan(dp=4, tp=8, pp=2, global_batch=256)
    est = estimate(model, cluster, plan, load_stack("megatron-deepspeed"))
    assert est.device_memory == pytest.approx(est.reserved_memory + beyond_reserved(plan, cluster.accelerator))
    assert est.device_memory > est.reserved_memory >= est.peak_memory
    # each counter the validation reads
    assert [peak_read(est, c) for c in ("allocated", "reserved", "device")] == [
        est.peak_memory, est.reserved_memory, est.device_memory]


def test_bloom_is_compared_with_the_device_reading():
    runs = read_runs(ROOT / "benchmarks" / "data" / "independent_runs.jsonl")
    case = map_run(next(r for r in runs if r["id"] == "bloom-pre-181b-dp8pp6mbs4-0221"))
    assert case.memory_peak == "device"
    result = evaluate_case(case)
    est = estimate(case.model, case.cluster, case.plan, case.stack)
    assert result.memory_predicted == pytest.approx(est.device_memory)
