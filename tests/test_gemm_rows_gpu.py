"""Single GEMMs measured on a lent H200 (data/measured/gpu/*-gemm-rows.json, benchmarks/measure/gemm_rows_gpu.py) and
what they gave meshplan: 64-wide tiles among the kernels it chooses from (specs/gemm_shape.TILES for training,
serve/efficiency.SERVE_TILES for decode), which is where cuBLAS's kernels put a GEMM's output features; and how near
its price of each GEMM is (benchmarks/docs/gemm_rows_doc.py, docs/GEMM_GPU.md)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from meshplan.serve.efficiency import SERVE_DEFAULT, SERVE_TILES
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.gemm_shape import TILES

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, next(ROOT.glob(f"benchmarks/*/{name}.py")))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the doc's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


doc = _script("gemm_rows_doc")
DATA = doc.load(doc.of_gpu("h200"))
ACC = doc.accelerator(DATA)


def _row(kind: str, model: str, name: str, m: int) -> dict:
    return next(r for r in doc.measured_rows(DATA, kind) if (r["model"], r["gemm"], r["m"]) == (model, name, m))


def test_the_file_is_the_h200_s_with_every_set():
    """One call: 9 weight matrices at 96 row counts (1-64, every 8th to 256, every 32nd to 512), 12 layer shapes at 3
    token counts in 3 passes, and the 9 matrices at 9 row counts in fp8, none refused."""
    assert DATA["machine"]["gpu"] == "NVIDIA H200" and ACC.num_sms == 132
    assert len(doc.measured_rows(DATA, "decode")) == 9 * (64 + 24 + 8)
    assert len(doc.measured_rows(DATA, "train")) == 12 * 3 * 3
    assert len(doc.measured_rows(DATA, "fp8")) == len(DATA["fp8"]) == 9 * 9


def test_cublas_puts_the_rows_on_the_narrow_side_of_its_tile():
    """At 1-48 rows every profiled decode kernel is nvjet_sm90_tst_<w>x<r>: the weight's output features on a w of
    64-512, the rows on r, the row count rounded up to a multiple of 8 (wgmma's N: PTX ISA, m64nNk16). A tile 64
    features wide is what most of them run: the one SERVE_TILES lacked."""
    seen = set()
    for r in doc.measured_rows(DATA, "decode"):
        if "kernels" in r and r["m"] <= 48:
            w, rows = (int(x) for x in doc.kernel_tile(r).split()[0].split("x"))
            assert rows == 8 * math.ceil(r["m"] / 8) and w in (64, 128, 256, 512), r
            seen.add(w)
    assert seen == {64, 128, 256, 512}
    assert (16, 64) in SERVE_TILES and (128, 64) in TILES and (64, 128) in TILES


def test_a_64_wide_tile_takes_away_a_split_cublas_does_not_make():
    """Llama 3 70B's output projection on one GPU of eight, 8,192 x 1,024, at one row: 8,192 / 64 = 128 tiles on 132
    SMs, ⌊132 / 128⌋ = 1: no split, as cuBLAS ran it (64x8, no splitK kernel). With 128-wide tiles alone it was 64
    tiles split ⌊132 / 64⌋ = 2 ways, and a reduction kernel (2.4 us) more: 9.6 us against the measured 7.0."""
    row = _row("decode", "llama3-70b-tp8", "o", 1)
    assert not doc.split_measured(row) and doc.kernel_tile(row) == "64x8"
    assert SERVE_DEFAULT.split_k_reductions(1.0, 8192.0, 1024.0, 132) == 0.0
    assert doc.BEFORE["serve"].split_k_reductions(1.0, 8192.0, 1024.0, 132) == 1.0
    now, before = doc.predicted(row, "decode", ACC), doc.predicted(row, "decode", ACC, doc.BEFORE)
    assert before - now == pytest.approx(ACC.kernel_overhead, rel=0.2)
    assert abs(now / row["s"] - 1) < 0.05 < before / row["s"] - 1


def test_a_training_gemm_of_few_tiles_runs_a_64_wide_one():
    """A 512 x 512 layer's forward GEMM at 2,048 tokens: cuBLAS ran a 128x64 tile, 2,048 / 128 x 512 / 64 = 128
    tiles, one wave on 132 SMs, no split. With 128 x 128 tiles alone meshplan priced 16 x 4 = 64 tiles split 2 ways:
    half the SMs' worth of tiles and a reduction kernel, +52 %."""
    row = next(r for r in doc.measured_rows(DATA, "train") if r["layer"] == [512, 512] and r["tokens"] == 2048
               and r["gemm"] == "fwd")
    assert doc.kernel_tile(row) == "128x64"
    assert DEFAULT.split_k_reductions(2048.0, 512.0, 512.0, 132) == 0.0
    assert doc.BEFORE["train"].split_k_reductions(2048.0, 512.0, 512.0, 132) == 1.0
    assert doc.predicted(row, "train", ACC, doc.BEFORE) / row["s"] - 1 > 0.4
    assert abs(doc.predicted(row, "train", ACC) / row["s"] - 1) < 0.1


def test_meshplan_prices_the_measured_gemms_near_their_times():
    """Median and p90 |error| of every set, and the p90 lower with the 64-wide tiles and the ridge than without in each
    (the numbers docs/GEMM_GPU.md renders; the ridge alone: tests/test_fit_ridge.py). Training's single GEMMs read 7 %
    slow on median: its GEMM efficiency is fitted on whole published steps (specs/efficiency.py ``gemm``), not on GEMMs
    alone."""
    bounds = {"decode": (0.04, 0.11), "fp8": (0.06, 0.15), "train": (0.09, 0.20)}
    for kind, (median, p90) in bounds.items():
        now, before = doc.summary(DATA, kind), doc.summary(DATA, kind, doc.BEFORE)
        assert now["median"] <= median and now["p90"] <= p90, (kind, now)
        assert now["p90"] < before["p90"], kind
        assert now["split_agree"] >= before["split_agree"], kind
    assert doc.summary(DATA, "train")["split_agree"] >= 0.95 * doc.summary(DATA, "train")["profiled"]


def test_the_split_k_reduction_costs_about_a_kernel_s_fixed_time():
    """cuBLAS's splitKreduce_kernel ran 1.5-5.4 us, 1.9 on median: within the kernel_overhead meshplan charges for
    it (2.4 us, hardware/h200.toml, from the profiled decode steps' gaps) on median; its longest reduce the most
    rows' partial sums."""
    times = doc.reduce_kernels(DATA)
    assert len(times) > 40
    assert min(times) > 1.4e-6 and max(times) < 6e-6
    assert sorted(times)[len(times) // 2] <= ACC.kernel_overhead


def test_the_gpu_is_not_monotone_in_rows_either():
    """The measured times step down where cuBLAS changes kernel: Llama 3 70B's gate-up shard on one GPU of eight
    runs 31 rows split over k and 32 unsplit, 3.8 us faster."""
    found = {(name, a, b) for name, a, b, _ in doc.drops(DATA, 0.10)}
    assert ("llama3-70b-tp8 gate_up", 31, 32) in found
    assert doc.split_measured(_row("decode", "llama3-70b-tp8", "gate_up", 24))
    assert not doc.split_measured(_row("decode", "llama3-70b-tp8", "gate_up", 32))


def test_the_h100_measured_after_agrees():
    """The same GEMMs on a lent H100, measured after the tiles and the ridge were chosen from the H200's file: the p90
    |error| of every set is lower with them (decode 15 → 6 %, fp8 19 → 8 %, training 27 → 14 %), the split-K choice is
    cuBLAS's more often, and the reduction kernel ran 1.5-3.2 us."""
    h100 = doc.load(doc.of_gpu("h100"))
    assert h100["machine"]["gpu"] == "NVIDIA H100 80GB HBM3" and doc.accelerator(h100).hbm_bandwidth == 3.35e12
    for kind, p90 in (("decode", 0.07), ("fp8", 0.09), ("train", 0.14)):
        now, before = doc.summary(h100, kind), doc.summary(h100, kind, doc.BEFORE)
        assert now["median"] < 0.05 and now["p90"] < p90 < before["p90"], kind
        assert now["split_agree"] > before["split_agree"], kind
    times = doc.reduce_kernels(h100)
    assert min(times) > 1.4e-6 and max(times) < 3.5e-6


def test_the_measuring_script_runs_on_a_cpu(tmp_path, monkeypatch):
    """benchmarks/measure/gemm_rows_gpu.py on this machine's CPU (narrow shapes, float32): a smoke test that it still
    runs and writes what the doc reads, the kernels at the profiled rows included (none on a CPU)."""
    pytest.importorskip("torch")
    script = _script("gemm_rows_gpu")
    monkeypatch.setattr(script.decode_gpu, "DEVICE", "cpu")
    out = tmp_path / "rows.json"
    assert script.main(["--out", str(out), "--rows", "1,17", "--profile-rows", "17", "--steps", "1",
                        "--tokens", "2048", "--sets", "decode,fp8"]) == 0
    data = doc.load(out)
    assert [r["m"] for r in data["decode"][:2]] == [1, 17] and len(data["decode"]) == 2 * 9
    assert all(r["s"] > 0 for r in data["decode"]) and "kernels" in data["decode"][1]
    assert data["fp8"] == []  # fp8 GEMMs need the GPU
