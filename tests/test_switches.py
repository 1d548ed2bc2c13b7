"""Framework switches as plan choices (issue 84 item 4; search/variants.py): grouped GEMMs searched beside per-expert
ones where the framework has them (Supports.expert_gemms), chosen for Qwen3-Next; and a plan the named framework cannot
run (tp2d under Megatron-Core) refused by ``estimate``."""

from __future__ import annotations

import json

import pytest

from meshplan.cli import main
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.search.variants import search_switches
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

NEXT = load_model("qwen3-next-80b-a3b")  # 512 routed experts, 10 of them a token
CORE = load_stack("megatron-core")


def test_per_expert_gemms_price_every_expert_on_one_gpu_far_slower():
    # tp 8, pp 4, ep 1 on 256 H100: all 512 experts on every GPU, a kernel each launched after the tokens-per-expert
    # sync, against one grouped GEMM: the 102.9 s against 4.0 s
    cluster = load_system("h100").cluster(256)
    plan = Plan(dp=8, tp=8, pp=4, global_batch=1024)
    per = estimate(NEXT, cluster, plan, CORE)
    grouped = estimate(NEXT, cluster, plan, CORE.with_(expert_gemm="grouped"))
    assert per.step_time > 10 * grouped.step_time


def test_the_frameworks_that_run_grouped_gemms():
    assert load_stack("megatron-core").supports.expert_gemms == ("per_expert", "grouped")
    assert load_stack("megatron-bridge").supports.expert_gemms == ("per_expert", "grouped")
    assert load_stack("deepspeed").supports.expert_gemms == ("per_expert",)
    space = Space(global_batch=64, expert_gemms=("per_expert", "grouped"), stack=load_stack("deepspeed"))
    assert space.expert_gemms == ("per_expert",)


def test_the_search_chooses_grouped_gemms_for_qwen3_next():
    cluster = load_system("h100").cluster(64)
    plain = search(NEXT, cluster, Space(global_batch=256), top_k=1, workers=1)
    both = search_switches(NEXT, cluster, Space(global_batch=256, expert_gemms=("per_expert", "grouped")), top_k=1)
    assert plain.plans[0].stack.expert_gemm == "per_expert"
    assert both.plans[0].stack.expert_gemm == "grouped"
    assert both.plans[0].step_time < 0.9 * plain.plans[0].step_time
    assert both.evaluated == 2 * plain.evaluated  # one search per choice
    # a dense model has no expert GEMMs to choose: the plain search
    dense = load_model("llama3-8b")
    one = search_switches(dense, cluster, Space(global_batch=64, expert_gemms=("per_expert", "grouped")), top_k=1)
    assert one.evaluated == search(dense, cluster, Space(global_batch=64), top_k=1, workers=1).evaluated


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_chooses_grouped_gemms_for_qwen3_next_from_the_command_line(capsys):
    base = ["plan", "--model", "qwen3-next-80b-a3b", "--system", "h100", "--gpus", "64", "--global-batch", "256",
            "--top", "2", "--json"]
    code, out, _ = _cli(capsys, *base)
    lead = json.loads(out)["plans"][0]
    assert code == 0 and lead["stack"]["expert_gemm"] == "grouped"
    code, out, _ = _cli(capsys, *base, "--expert-gemm", "per_expert")
    pinned = json.loads(out)["plans"][0]
    assert pinned["stack"]["expert_gemm"] == "per_expert" and pinned["step_time_s"] > lead["step_time_s"]


@pytest.mark.parametrize("extra, problem", [
    (("--tp", "2", "--tp2", "2", "--layout", "tp2d"), "tensor_layout=tp2d"),
    (("--tp", "2", "--tp2", "2", "--layout", "summa"), "tensor_layout=summa"),
    (("--pp", "2", "--schedule", "gpipe"), "schedule=gpipe"),
])
def test_estimate_refuses_what_the_named_framework_cannot_run(capsys, extra, problem):
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", *extra]
    code, _, err = _cli(capsys, *base, "--framework", "megatron-core")
    assert code == 2 and f"framework megatron-core does not run {problem}" in err and "Traceback" not in err
    code, out, err = _cli(capsys, *base, "--json")  # the default framework: priced, the JSON says what it lacks
    assert code == 0 and problem in json.loads(out)["refused_by_framework"]
    code, _, _ = _cli(capsys, *base, "--framework", "any")
    assert code == 0


def test_the_twin_searches_of_a_job_build_its_size_rows_and_pool_once():
    """candidates.mode_pool: the expert-GEMM twins of a job (workers._evaluate_task) differ in the stack alone, which
    neither the size rows nor the pool reads, so the second takes the first's objects and counts the build
    rejections the first counted (e.g. 'interleaved: pp does not divide the micro-batches', the same number); a space
    that differs in what they read (the global batch) builds its own, the same as a fresh build."""
    import numpy as np  # noqa: PLC0415

    from meshplan.search.candidates import Twin, mode_pool  # noqa: PLC0415
    from meshplan.search.combos import valid_combos  # noqa: PLC0415
    from meshplan.search.tally import Tally  # noqa: PLC0415

    cluster = load_system("h100").cluster(64)
    per, grouped = (Space(global_batch=256, stack=CORE.with_(expert_gemm=g)) for g in ("per_expert", "grouped"))
    combos, _ = valid_combos(NEXT, cluster, per)
    mode = next(iter(per.modes()))
    layout_combos = [c for c in combos if c.layout == mode[0]]
    twin = Twin()
    first, again, alone = Tally(), Tally(), Tally()
    built = mode_pool(mode, layout_combos, cluster, per, first, twin)
    taken = mode_pool(mode, layout_combos, cluster, grouped, again, twin)
    fresh = mode_pool(mode, layout_combos, cluster, grouped, alone)
    assert built is not None and taken is not None and fresh is not None
    assert taken[0] is built[0] and taken[1] is built[1]  # the same objects: nothing built again
    assert first.counts == again.counts == alone.counts and first.examples == again.examples == alone.examples
    for name in ("tp", "pp", "micro_batch", "ep", "placement_id"):
        assert np.array_equal(getattr(fresh[0], name), getattr(built[0], name))
    assert np.array_equal(fresh[1].count, built[1].count)
    other = mode_pool(mode, layout_combos, cluster, Space(global_batch=512, stack=grouped.stack), Tally(), twin)
    assert other is not None and other[0] is not built[0]
    assert twin.made is not None and twin.made.pool is other  # built anew, and kept


def test_a_layouts_size_rows_are_built_once_for_its_tensor_modes_within_rows_kept(monkeypatch):
    """candidates.rows_kept (one process's tasks, workers._evaluated): the jobs of a layout's two tensor modes (sequence
    parallelism off, then on) over the same combinations build its size rows once (layout_rows called once), the
    second mode's pool the same columns, strides, settings and build rejections as built alone; other combinations,
    or outside rows_kept, build their own."""
    import numpy as np  # noqa: PLC0415

    from meshplan.search import candidates  # noqa: PLC0415
    from meshplan.search.batch import NUMERIC  # noqa: PLC0415
    from meshplan.search.combos import valid_combos  # noqa: PLC0415
    from meshplan.search.tally import Tally  # noqa: PLC0415

    cluster, space = load_system("h100").cluster(64), Space(global_batch=256, stack=CORE)
    combos, _ = valid_combos(NEXT, cluster, space)
    modes = [m for m in space.modes() if m[0] == "1d"]
    assert [sp for _, sp in modes] == [False, True]
    layout_combos = [c for c in combos if c.layout == "1d"]
    real, calls = candidates.layout_rows, []
    monkeypatch.setattr(candidates, "layout_rows", lambda *a: calls.append(1) or real(*a))
    tallies = (Tally(), Tally())
    with candidates.rows_kept():
        kept = [candidates.mode_pool(m, list(layout_combos), cluster, space, t, candidates.Twin())
                for m, t in zip(modes, tallies, strict=True)]
        assert len(calls) == 1
        candidates.mode_pool(modes[1], layout_combos[1:], cluster, space, Tally(), candidates.Twin())
        assert len(calls) == 2
    alone_tally = Tally()
    alone = candidates.mode_pool(modes[1], layout_combos, cluster, space, alone_tally)
    assert len(calls) == 3 and alone is not None and kept[1] is not None
    (batch, sized), (own, own_sized) = kept[1], alone
    assert tallies[1].counts == alone_tally.counts and tallies[1].examples == alone_tally.examples
    for name in (*NUMERIC, "placement_id"):
        assert np.array_equal(getattr(batch, name), getattr(own, name))
    assert all(np.array_equal(batch.strides[a], own.strides[a]) for a in own.strides)
    assert batch.sequence_parallel and own.sequence_parallel and batch.placements == own.placements
    assert all(np.array_equal(sized.columns[k], v) for k, v in own_sized.columns.items())
    assert np.array_equal(sized.count, own_sized.count) and np.array_equal(sized.start, own_sized.start)
