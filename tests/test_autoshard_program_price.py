"""The sharding planner shows the step time of the program it prints (issue 47 item 4): where program.py writes a
parameter otherwise than the plan holds it (a mesh dimension's one role: fully_shard's Shard(0) on a sharded
dimension, whole on a replicated one, only ColwiseParallel / RowwiseParallel on a tensor-parallel one), the
parameters are pinned as written and the integer program solved again for the rest (autoshard/as_written.py); that
program's step is what the report shows, beside the plan's. tests/test_autoshard_run.py runs the same printed
programs on gloo against the unsharded model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("scipy")

from meshplan.autoshard.as_written import as_written, written  # noqa: E402
from meshplan.autoshard.output import params  # noqa: E402
from meshplan.autoshard.planner import Request, plan_sharding  # noqa: E402
from meshplan.autoshard.program import roles  # noqa: E402
from meshplan.cli.main import cli  # noqa: E402
from test_autoshard_run import AUDIT, MODELS  # noqa: E402


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("audit") / "mm.py"
    path.write_text(AUDIT)
    return str(path)


def test_the_hsdp_program_is_priced_as_written(audit):
    """The audit's transformer on a 2 x 2 mesh: the plan keeps some weights whole or split on another tensor dimension
    where the program's fully_shard shards dimension 0. Pinned so, the best step is 2.088 ms where the plan's was
    2.086 ms (+0.1 %; 2.054 against 2.052 ms before the roofline's ridge, roofline.work_time: this small model's GEMMs
    sit near it; 2.440 against 2.438 ms before GEMMs of fewer tiles than SMs split k, specs/gemm_shape.py; 2.306
    against 2.304 ms before each kernel paid the fixed time measured on Hopper; 2.32 against 2.22 ms before the
    collectives inside tier 0 paid NCCL's protocol latencies, protocols.py): a constraint never speeds the optimum, and
    the program's parameters are the written ones. Priced on the GPU alone (host_dispatch 0): the host's launches of
    this small model's eager kernels (2.9 ms) would hide the difference."""
    result = plan_sharding(Request(model=f"{audit}:make_model", gpus=4, mesh=(2, 2), input_shapes=((64, 512),),
                                   dtypes=("int64",), stages="off", host_dispatch=0.0))
    plan = result.intra
    program = as_written(plan)
    assert program.changed and program.sharding.fits
    assert program.sharding.step_time >= plan.step_time * (1 - 1e-9)
    assert program.sharding.step_time == pytest.approx(2.088e-3, rel=0.02)
    assert plan.step_time == pytest.approx(2.086e-3, rel=0.02)
    role = roles(params(plan), 2)
    for before, after in zip(params(plan), params(program.sharding), strict=True):
        assert after.placements == written(before.placements, before.styles, role), before.name


def test_a_program_that_writes_the_plan_whole_is_the_plan():
    """The gated MLP on 2 GPUs: packed, no '# not written' line; unless a parameter is written otherwise, the
    program's price is the plan's own (no second solve)."""
    result = plan_sharding(Request(model=f"{MODELS}:make_gated_plan", gpus=2, input_shapes=((1, 4096),),
                                   dtypes=("int64",), stages="off"))
    program = as_written(result.intra)
    assert not program.left_out and not program.unpriced
    if not program.changed:
        assert program.sharding is result.intra
    assert program.sharding.step_time >= result.intra.step_time * (1 - 1e-9)


def test_the_report_shows_the_programs_step(audit):
    args = ["plan", "--model", f"{audit}:make_model", "--system", "h100", "--gpus", "4", "--mesh", "2x2",
            "--input-shape", "64x512", "--dtype", "int64", "--stages", "off", "--host-dispatch", "0"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "as the program below writes it" in text.output and "the plan: 2.09" in text.output
    data = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert data["program"]["step_time_s"] > data["program"]["plan_step_time_s"] == data["step_time_s"]
    assert data["program"]["parameters_written_otherwise"]
