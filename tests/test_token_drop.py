"""Token-drop MoE (Plan.moe_expert_capacity_factor, specs/token_drop.py): an expert's capacity as Megatron-Core's
get_capacity computes it, the rows and bytes it bounds, the padded split the host knows (no tokens-per-expert sync,
so no per-expert host floor), what the check refuses, and a larger capacity never a faster padded step."""

from __future__ import annotations

import pytest

from bad_input_helpers import estimate as estimate_args
from bad_input_helpers import fails
from meshplan.cli import main
from meshplan.cost.layers import moe_layer
from meshplan.cost.mlp_moe import TE_LINEAR
from meshplan.estimate import estimate
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.specs.token_drop import capacity, host_known, routed_rows

H100 = load_system("h100")
QWEN = load_model("qwen3-30b-a3b").with_seq_length(4096)  # top-8 of 128 experts, hidden 2048, expert ffn 768
# the per-expert path (TE GroupedLinear's cuBLAS GEMMs launched from the host), as the 25.09 recipes run it
STACK = load_stack("megatron-core").with_(expert_gemm="per_expert", cuda_graphs=False)
PLAN = Plan(dp=8, ep=8, micro_batch=1, global_batch=64)


def dropping(factor: float | None, padded: bool = False, plan: Plan = PLAN) -> Plan:
    return plan.with_(moe_expert_capacity_factor=factor, moe_pad_expert_input_to_capacity=padded)


def test_capacity_is_megatron_cores_ceiling():
    """get_capacity: ceil(tokens x topk / experts x F). 4,096 tokens x 8 / 128 = 256 a expert at F 1 (256 x 128 =
    32,768 = 4,096 x 8: padding adds nothing under a balanced router); F 1.25: 320, padded 40,960 rows, not padded
    min(32,768, 40,960) = 32,768; F 0.5: 128 a expert, 16,384 rows either way. 100 tokens x 2 / 8 at F 1.1 = 27.5,
    ceil 28: 224 rows padded."""
    assert capacity(dropping(1.0), 4096, 8, 128) == 256
    assert routed_rows(dropping(1.0, True), 4096, 8, 128) == 32768
    assert routed_rows(dropping(1.25, True), 4096, 8, 128) == 40960
    assert routed_rows(dropping(1.25), 4096, 8, 128) == 32768
    assert routed_rows(dropping(0.5), 4096, 8, 128) == routed_rows(dropping(0.5, True), 4096, 8, 128) == 16384
    assert routed_rows(dropping(1.1, True), 100, 2, 8) == 224
    assert routed_rows(dropping(None), 4096, 8, 128) == 4096 * 8
    assert host_known(dropping(1.0, True)) and not host_known(dropping(1.0)) and not host_known(dropping(None))


def _ops(plan: Plan) -> dict[tuple[str, str], object]:
    return {(op.name, op.phase): op for op in moe_layer(QWEN, plan, STACK)}


def test_rows_bytes_and_the_host_floor():
    """dp 8 x ep 8, one 4,096-token sequence a GPU: dropless 32,768 routed rows of 2,048 bf16 values, 134 MB each
    way; padded at F 1.25, 40,960 rows: the all-to-all carries 1.25x the bytes and fc1 1.25x the FLOPs
    (2 x 40,960 x 2,048 x 1,536). Dropless (and not padded) the 16 local experts' kernels are launched after the
    sync, each GEMM at the stack's cost per kernel x TE_LINEAR; padded the same launches carry no floor."""
    dropless, padded, unpadded = _ops(dropping(None)), _ops(dropping(1.25, True)), _ops(dropping(1.25))
    a2a = ("moe/dispatch", "fwd")
    assert dropless[a2a].nbytes == 32768 * 2048 * 2
    assert padded[a2a].nbytes == 40960 * 2048 * 2 == 1.25 * dropless[a2a].nbytes
    fc1 = ("moe/experts/fc1", "fwd")
    assert padded[fc1].flops == 2 * 40960 * 2048 * 1536 == 1.25 * dropless[fc1].flops
    assert unpadded[fc1].flops == dropless[fc1].flops  # min(load, capacity): the mean load under balanced routing
    per_kernel = STACK.host.per_kernel
    for ops in (dropless, unpadded):
        assert ops[fc1].launches == 16 and ops[fc1].launch_host == pytest.approx(per_kernel * TE_LINEAR)
    assert padded[fc1].launches == 16 and padded[fc1].launch_host == 0.0


def test_padding_drops_the_floor_and_never_slows_the_step():
    """At F 1 the padded step does the dropless work without the per-expert floor: never slower; not padded it keeps
    the sync, and at F 1 its rows are the dropless ones: the same step."""
    cluster = H100.cluster(PLAN.num_gpus)
    dropless = estimate(QWEN, cluster, dropping(None), STACK).step_time
    assert estimate(QWEN, cluster, dropping(1.0, True), STACK).step_time <= dropless
    assert estimate(QWEN, cluster, dropping(1.0), STACK).step_time == pytest.approx(dropless, rel=1e-12)


@pytest.mark.parametrize("padded", [True, False])
def test_a_larger_capacity_is_never_faster(padded):
    """Padded, every expert computes and exchanges exactly its capacity: the step grows with F. Not padded, the rows
    are min(load, capacity): non-decreasing too, flat past F 1."""
    cluster = H100.cluster(PLAN.num_gpus)
    times = [estimate(QWEN, cluster, dropping(f, padded), STACK).step_time for f in (0.25, 0.5, 1.0, 1.5, 2.0, 4.0)]
    assert times == sorted(times)
    if padded:
        assert times[-1] > times[2] > times[0]


def test_the_check_refuses_what_megatron_core_does_not_run():
    dense = load_model("llama3-8b")
    assert any("needs moe_expert_capacity_factor" in r for r in check(QWEN, None, PLAN.with_(
        moe_pad_expert_input_to_capacity=True), STACK))
    assert any("has no experts" in r for r in check(dense, None, Plan(dp=8).with_(moe_expert_capacity_factor=1.0)))
    flex = STACK.with_(moe_dispatcher="flex")
    assert any("alltoall dispatcher only" in r for r in check(QWEN, None, dropping(1.0, True), flex))
    assert any("is outside 0.01" in r for r in check(QWEN, None, dropping(0.0), STACK))
    assert not check(QWEN, None, dropping(1.0, True), STACK)


@pytest.mark.parametrize(("extra", "message"), [
    (["--moe-expert-capacity-factor", "-1"], "moe-expert-capacity-factor=-1.0 is outside 0.01 … 1,024"),
    (["--moe-pad-expert-input-to-capacity"], "moe_pad_expert_input_to_capacity=true needs moe_expert_capacity_factor"),
])
def test_a_bad_value_is_one_line_and_exit_2(extra, message, capsys):
    assert message in fails(estimate_args("qwen3-30b-a3b", "h100", "--ep", "8", "--global-batch", "64", *extra), capsys)


def test_the_command_line_takes_it():
    args = estimate_args("qwen3-30b-a3b", "h100", "--ep", "8", "--global-batch", "64", "--json",
                    "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity")
    assert main(args) == 0
