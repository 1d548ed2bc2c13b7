"""Sweeps: points, hardware scaling, monotonicity (more bandwidth is never slower), files pandas reads, and the
serial, process-pool and Ray paths giving identical rows."""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import gpt
from meshplan.cli import main
from meshplan.errors import MissingDependency, SpecError
from meshplan.search.sweep import (
    PARAMS,
    SWEEP_COLUMNS,
    param_points,
    read_csv,
    scaled_system,
    scaling_points,
    search_points,
    sweep_space,
    write_csv,
    write_json,
)
from meshplan.specs.hardware import load_system

GBS = 64  # sequences per step: 64 x 2048 tokens


@pytest.fixture(scope="module")
def model():
    return gpt()  # 4 layers, hidden 1024: each search takes ~50 ms


@pytest.fixture(scope="module")
def quick():
    return sweep_space(GBS, all_placements=False, offload=False)


def test_scaled_system_changes_one_field():
    h100 = load_system("h100")
    acc, net = h100.accelerator, h100.network
    assert scaled_system(h100, "hbm_bandwidth", 2).accelerator.hbm_bandwidth == 2 * acc.hbm_bandwidth
    assert scaled_system(h100, "hbm_capacity", 0.5).accelerator.hbm_bytes == 0.5 * acc.hbm_bytes
    assert scaled_system(h100, "nvlink_bandwidth", 4).accelerator.nvlink_bandwidth == 4 * acc.nvlink_bandwidth
    assert scaled_system(h100, "nic_bandwidth", 2).network.nic_bandwidth == 2 * net.nic_bandwidth
    assert scaled_system(h100, "nvlink_domain", 8).network.nvlink_domain == 64  # 8 x 8
    flops = scaled_system(h100, "peak_flops", 2).accelerator.peak_flops
    assert flops == {k: 2 * v for k, v in acc.peak_flops.items()}
    unchanged = scaled_system(h100, "nic_bandwidth", 2)
    assert unchanged.accelerator == acc and unchanged.network.nvlink_domain == net.nvlink_domain
    with pytest.raises(SpecError, match="whole number"):
        scaled_system(h100, "nvlink_domain", 0.3)  # 8 x 0.3 = 2.4 GPUs
    with pytest.raises(SpecError, match="must be one of"):
        scaled_system(h100, "hbm_size", 2)
    with pytest.raises(SpecError, match="positive"):
        scaled_system(h100, "hbm_bandwidth", 0)


def test_points_are_the_product_and_checked_up_front(model, quick):
    points = param_points(model, ["a100", "h100"], [8, 16, 32], GBS, param="hbm_bandwidth", factors=(0.5, 1, 2),
                          nvlink=(4, 8), space=quick)
    assert len(points) == 2 * 2 * 3 * 3  # systems x NVLink sizes x factors x GPU counts
    assert {p.system.network.nvlink_domain for p in points} == {4, 8}
    assert {p.value for p in points if p.factor == 1 and p.label == "a100"} == {
        load_system("a100").accelerator.hbm_bandwidth}
    assert len(scaling_points(model, ["h100"], [8, 16], GBS, space=quick)) == 2
    with pytest.raises(SpecError, match="multiple of the NVLink domain"):
        scaling_points(model, ["h100"], [8, 12], GBS, space=quick)  # 12 GPUs on 8-GPU NVLink domains


@pytest.mark.parametrize("param", ["hbm_bandwidth", "nic_bandwidth", "nvlink_bandwidth", "peak_flops",
                                   "hbm_capacity", "host_bandwidth"])
def test_more_hardware_never_lowers_throughput(model, param):
    # The search is exhaustive, so the best plan can only get faster when any one resource grows.
    factors = (0.25, 0.5, 1, 2, 4)
    points = param_points(model, ["h100"], [32], GBS, param=param, factors=factors,
                          space=sweep_space(GBS, all_placements=False))
    rows = search_points(points, workers=1, progress=False)
    speed = [r["tokens_per_s"] or 0.0 for r in rows]
    assert [r["factor"] for r in rows] == list(factors)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(speed, speed[1:], strict=False)), (param, speed)
    if param not in ("hbm_capacity", "host_bandwidth"):  # the best plan offloads nothing: the host link idles
        assert speed[-1] > speed[0]  # and the resource matters somewhere in the range


@pytest.mark.parametrize("param", ["nvlink_latency", "nic_latency"])
def test_more_latency_never_raises_throughput(model, param):
    """The α of every collective (comm.py: latency per message step + bytes / bandwidth): the exhaustive search's
    best plan can only get slower as a latency grows, and with 100x NVLink or network latency it does."""
    factors = (0.25, 1, 4, 100)
    points = param_points(model, ["h100"], [32], GBS, param=param, factors=factors,
                          space=sweep_space(GBS, all_placements=False))
    speed = [r["tokens_per_s"] for r in search_points(points, workers=1, progress=False)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(speed, speed[1:], strict=False)), (param, speed)
    assert speed[-1] < speed[0]
    assert points[1].value == 4 * points[0].value  # 1 / 0.25


def test_latency_and_host_link_scale_their_own_field():
    h100, meta = load_system("h100"), load_system("h100-meta-24k")
    net = h100.network
    assert scaled_system(h100, "nvlink_latency", 2).network.nvlink_latency == 2 * net.nvlink_latency
    assert scaled_system(h100, "nic_latency", 3).network == replace(net, nic_latency=3 * net.nic_latency)
    assert scaled_system(h100, "host_bandwidth", 2).network.host_bandwidth == 2 * net.host_bandwidth
    tiers = scaled_system(meta, "nic_latency", 2).network.tiers  # every tier beyond NVLink, on an N-tier network
    assert [t.latency for t in tiers] == [meta.network.tiers[0].latency, *(2 * t.latency
                                                                           for t in meta.network.tiers[1:])]
    assert scaled_system(meta, "nvlink_latency", 2).network.tiers[1:] == meta.network.tiers[1:]


def test_infeasible_point_is_a_row_not_an_error(model, quick, tmp_path):
    points = param_points(model, ["h100"], [8], GBS, param="hbm_capacity", factors=(1e-4,), space=quick)
    (row,) = search_points(points, workers=1, progress=False)
    assert row["feasible"] is False and row["tokens_per_s"] is None and row["plan"] is None
    assert row["evaluated"] > 0 and row["feasible_plans"] == 0
    write_csv([row], tmp_path / "r.csv")
    (back,) = read_csv(tmp_path / "r.csv")
    assert back["tokens_per_s"] is None and back["feasible"] is False


def test_files_have_the_columns_and_round_trip(model, quick, tmp_path):
    points = param_points(model, ["a100", "h100"], [8, 16], GBS, nvlink=(4, 8), space=quick)
    rows = search_points(points, workers=1, progress=False)
    assert all(list(r) == list(SWEEP_COLUMNS) for r in rows)
    write_csv(rows, tmp_path / "s.csv")
    write_json(rows, tmp_path / "s.json")
    with (tmp_path / "s.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == SWEEP_COLUMNS
        lines = list(reader)
    assert len(lines) == len(rows) == 8
    for line, row in zip(lines, rows, strict=True):
        assert float(line["tokens_per_s"]) == row["tokens_per_s"]  # repr round-trips exactly
        assert line["system"] == row["system"] and int(line["gpus"]) == row["gpus"]
        assert line["param"] == "none" and line["value"] == ""  # NaN in pandas
    assert read_csv(tmp_path / "s.csv") == rows
    data = json.loads((tmp_path / "s.json").read_text())
    assert data == json.loads(json.dumps(rows))  # an array of row objects, null where empty
    # the selective recompute's modules and the last stage's layers (0: an even split) are columns of their own
    for row in rows:
        assert row["recompute_modules"] == ("core_attn" if row["recompute"] == "selective" else None)
        assert row["last_stage_layers"] == 0
    # the step-time components add up to the step time
    for row in rows:
        parts = sum(row[f"time_{c}_s"] for c in ("compute", "recompute", "tp", "cp", "ep", "pp", "bubble", "dp",
                                                 "optimizer", "offload"))
        assert math.isclose(parts, row["step_time_s"], rel_tol=1e-9)


def test_pandas_reads_the_files(model, quick, tmp_path):
    pd = pytest.importorskip("pandas")
    points = param_points(model, ["h100"], [8, 16], GBS, param="nic_bandwidth", factors=(1, 2), space=quick)
    rows = search_points(points, workers=1, progress=False)
    write_csv(rows, tmp_path / "s.csv")
    write_json(rows, tmp_path / "s.json")
    for frame in (pd.read_csv(tmp_path / "s.csv"), pd.read_json(tmp_path / "s.json")):
        assert list(frame.columns) == list(SWEEP_COLUMNS) and len(frame) == 4
        assert frame["tokens_per_s"].dtype.kind == "f" and frame["gpus"].dtype.kind == "i"
        assert frame["tokens_per_s"].tolist() == [r["tokens_per_s"] for r in rows]


def test_pool_and_serial_give_identical_rows(model, quick):
    points = param_points(model, ["a100", "h100"], [8, 16, 32], GBS, space=quick)
    ticks = []
    serial = search_points(points, workers=1, progress=lambda done, total: ticks.append((done, total)))
    pooled = search_points(points, workers=2, progress=False)
    assert pooled == serial
    assert ticks[-1] == (len(points), len(points)) and len(ticks) == len(points)


def test_ray_local_instance_gives_identical_rows(model, quick):
    ray = pytest.importorskip("ray")
    points = param_points(model, ["h100"], [8, 16], GBS, param="peak_flops", factors=(1, 2), space=quick)
    serial = search_points(points, workers=1, progress=False)
    try:
        assert search_points(points, ray_address="local", progress=False) == serial  # ray.init() of a local instance
    finally:
        ray.shutdown()  # a no-op when search_points() shut it down as it should
    assert not ray.is_initialized()


def test_an_address_ray_cannot_parse_is_a_one_line_error(model, quick):
    ray = pytest.importorskip("ray")
    points = scaling_points(model, ["h100"], [8], GBS, space=quick)
    with pytest.raises(SpecError, match=r"ray='bogus': cannot connect to a Ray cluster"):
        search_points(points, ray_address="bogus", progress=False)
    assert not ray.is_initialized()


def test_missing_ray_names_the_extra(model, quick, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    points = scaling_points(model, ["h100"], [8], GBS, space=quick)
    with pytest.raises(MissingDependency, match=r"pip install 'meshplan\[ray\]'"):
        search_points(points, ray_address="auto", progress=False)


def test_params_are_documented():
    params = {"peak_flops", "hbm_bandwidth", "hbm_capacity", "nvlink_bandwidth", "nic_bandwidth", "nvlink_domain",
              "nvlink_latency", "nic_latency", "host_bandwidth"}
    assert set(PARAMS) == params
    text = (Path(__file__).parents[1] / "docs" / "REPORTS.md").read_text()
    assert all(f"`{p}`" in text for p in params)


# ---- CLI -----------------------------------------------------------------------------------------------------------
def test_sweep_command_writes_tables_and_pictures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    code = main(["sweep", "--model", "gpt2", "--systems", "a100,h100", "--nvlink", "4,8", "--gpus", "8,16",
                 "--global-batch", "64", "--placements", "default", "--no-offload", "--workers", "1", "-o",
                 str(out)])
    assert code == 0, capsys.readouterr().err
    assert {p.name for p in out.iterdir()} == {"sweep.csv", "sweep.json", "scaling.png", "scaling.svg"}
    rows = read_csv(out / "sweep.csv")
    assert len(rows) == 2 * 2 * 2 and {r["system"] for r in rows} == {"a100", "h100"}
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_command_format_none_writes_the_rows_only(tmp_path, capsys):
    """--format none: sweep.csv and sweep.json, no picture (what the docs' sweep-row check reads)."""
    code = main(["sweep", "--model", "gpt2", "--systems", "h100", "--gpus", "8", "--global-batch", "64",
                 "--placements", "default", "--no-offload", "--workers", "1", "--format", "none", "-o", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert {p.name for p in tmp_path.iterdir()} == {"sweep.csv", "sweep.json"}
    assert len(read_csv(tmp_path / "sweep.csv")) == 1


def test_sweep_command_param(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code = main(["sweep", "--model", "gpt2", "--systems", "h100", "--gpus", "8,16", "--global-batch", "64",
                 "--param", "hbm_bandwidth,nvlink_domain", "--factors", "0.5,1,2", "--placements", "default",
                 "--no-offload", "--workers", "1", "--format", "svg", "-o", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert {"param-hbm_bandwidth.svg", "param-nvlink_domain.svg"} <= {p.name for p in tmp_path.iterdir()}
    rows = read_csv(tmp_path / "sweep.csv")
    assert {r["value"] for r in rows if r["param"] == "nvlink_domain"} == {4, 8, 16}


@pytest.mark.parametrize("args, message", [
    (["--gpus", "8,x"], "gpus='8,x' must be integers"),
    (["--gpus", "12"], "not a multiple of the NVLink domain"),
    (["--gpus", "8", "--param", "hbm"], "param='hbm' must be one of"),
    (["--gpus", "8", "--factors", "1,-2"], "factors='1,-2' must be numbers from 1e-06"),
    (["--gpus", "8", "--format", "jpg"], "format='jpg' must be png or svg"),
    (["--gpus", "8", "--format", "none,svg"], "format='none,svg': none (no pictures) goes alone"),
])
def test_sweep_command_bad_input_is_one_line(args, message, tmp_path, capsys):
    code = main(["sweep", "--model", "gpt2", "--systems", "h100", "-o", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
