"""Which mesh tier each parallel axis' groups stay within (groups.axis_tiers; 'tiers' in estimate's and plan's JSON),
and plan --all: every feasible plan as CSV (report/plans_csv.py)."""

from __future__ import annotations

import csv
import json

import pytest

from meshplan.cli import main
from meshplan.collectives.comm import split_group
from meshplan.collectives.groups import axis_layout, axis_tiers
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack


def test_default_placement_on_two_tiers():
    """64 H100s = 8 NVLink domains of 8: tp=8 innermost spans ranks 0-7 (one domain); dp=8 at stride 8 spans
    0, 8, …, 56 (the network); pp and cp of size 1 have no groups."""
    cluster = load_system("h100").cluster(64)
    assert axis_tiers(Plan(dp=8, tp=8), cluster) == {"tp": "nvlink", "dp": "network"}
    # dp innermost: dp=8 at stride 1 in one domain, tp=8 at stride 8 across domains
    assert axis_tiers(Plan(dp=8, tp=8, placement=("dp", "tp", "cp", "pp")), cluster) == {
        "dp": "nvlink", "tp": "network"}


def test_a_group_that_straddles_a_rack_is_not_inside_it():
    """GB200 NVL72 racks of 72 GPUs, 144 GPUs: tp=16 at stride 1 puts ranks 64-79 in two racks (gcd(16, 72) = 8
    members of 16 inside one), so tp is on the network although 16 < 72; tp=8 (72 / 8 = 9 groups) stays in a rack."""
    cluster = load_system("gb200").cluster(144)
    assert axis_tiers(Plan(dp=9, tp=16), cluster)["tp"] == cluster.tiers[1].name
    assert axis_tiers(Plan(dp=18, tp=8), cluster)["tp"] == cluster.tiers[0].name


@pytest.mark.parametrize("placement", [("tp", "cp", "dp", "pp"), ("dp", "tp", "cp", "pp"), ("cp", "pp", "tp", "dp")])
def test_tiers_agree_with_the_cost_models_split(placement):
    """On three tiers (8 x 256 x 8, h100-meta-24k at 4,096 GPUs: 8 x 256 x 2): an axis stays within tier i exactly when
    comm.split_group, which prices its collectives, puts one member on every tier beyond i."""
    cluster = load_system("h100-meta-24k").cluster(4096)
    plan = Plan(dp=32, tp=8, pp=8, cp=2, placement=placement)
    names = [t.name for t in cluster.tiers]
    for axis, tier in axis_tiers(plan, cluster).items():
        # the axis' own group (dp alone, the whole pipeline), where axis_layout prices dp·cp and a send's pair
        layout = plan.stride(axis) if axis in ("dp", "pp") else axis_layout(plan, axis)
        split = split_group(cluster, getattr(plan, axis), layout)
        inner = names.index(tier)
        assert all(round(float(g)) == 1 for g in split[inner + 1:]) and round(float(split[inner])) > 1


def test_estimate_json_and_text_name_the_tiers(capsys):
    args = ["estimate", "--model", "llama3-70b", "--system", "h100-meta-24k", "--gpus", "4096", "--tp", "8", "--pp",
            "8", "--cp", "2"]
    assert main([*args, "--json"]) == 0
    tiers = json.loads(capsys.readouterr().out)["tiers"]
    # tp 8 x cp 2 = 16 > 8 (NVLink) and dp 32 x 16 = 512 <= 8 x 256 (a pod); pp outermost (x 512 = 4,096): the top
    assert tiers == {"tp": "nvlink", "cp": "pod", "dp": "pod", "pp": "aggregation"}
    assert main(args) == 0
    assert "tp=8: nvlink, cp=2: pod, dp=32: pod, pp=8: aggregation" in capsys.readouterr().out


def test_plan_json_has_tiers_per_plan(capsys):
    assert main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--global-batch", "64",
                 "--json", "--top", "3"]) == 0
    for plan in json.loads(capsys.readouterr().out)["plans"]:
        sizes = {a: plan["plan"][a] for a in ("tp", "pp", "cp", "dp", "ep")}
        assert set(plan["tiers"]) == {a for a, n in sizes.items() if n > 1}


def test_plan_all_writes_every_feasible_plan(tmp_path, capsys):
    """One CSV row per feasible plan: as many rows as the search's feasible count, every one within the HBM less the
    headroom, fastest first, the fastest the search's fastest (float32 sums against estimate's float64)."""
    out = tmp_path / "plans.csv"
    args = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--global-batch", "64", "--json"]
    assert main([*args, "--all", "-o", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == result["feasible"] > 1000
    times = [float(r["step_time_s"]) for r in rows]
    assert times == sorted(times)
    assert times[0] <= min(p["step_time_s"] for p in result["plans"]) * (1 + 1e-5)
    for row in rows[:3] + rows[-3:]:  # the fastest and the slowest, as estimate() prices them
        est = estimate(load_model("llama3-8b"), load_system("h100").cluster(8), row_plan(row),
                       load_stack("megatron-core"))
        assert float(row["step_time_s"]) == pytest.approx(est.step_time, rel=1e-5)
        assert float(row["peak_memory_bytes"]) == pytest.approx(est.peak_memory, rel=1e-5)
    hbm = result["plans"][0]["hbm_bytes"]
    assert max(float(r["peak_memory_bytes"]) for r in rows) <= hbm
    first = rows[0]
    assert int(first["dp"]) * int(first["tp"]) * int(first["pp"]) * int(first["cp"]) * int(first["tp2"]) == 8
    # gbs 64 x 8,192 tokens / step time
    assert float(first["tokens_per_s"]) == pytest.approx(64 * 8192 / times[0])


def row_plan(row: dict[str, str]) -> Plan:
    """The Plan of a CSV row (the search's shared settings: bf16, 4-byte gradients)."""
    ints = {k: int(row[k]) for k in ("dp", "tp", "tp2", "pp", "cp", "ep", "etp", "vpp", "last_stage_layers",
                                     "micro_batch", "zero", "recompute_layers", "offload_layers")}
    flags = {k: row[k] == "true" for k in ("sequence_parallel", "offload_optimizer", "offload_activations")}
    return Plan(**ints, **flags, global_batch=64, recompute=row["recompute"], schedule=row["schedule"],
                tensor_layout=row["tensor_layout"], placement=tuple(row["placement"].split(",")), grad_bytes=4)


@pytest.mark.parametrize("args, message", [(["--all"], "--all writes every feasible plan to --output"),
                                           (["-o", "x.csv"], "output=x.csv needs --all")])
def test_all_and_output_go_together(capsys, args, message):
    assert main(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", *args]) == 2
    assert message in capsys.readouterr().err
