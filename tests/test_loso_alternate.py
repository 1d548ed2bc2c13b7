"""A single-source constant refitted on another source's runs out of source (meshplan_validation/loso_serving.py
``ALTERNATE``): vLLM V0's iteration latency, fitted on Argonne's H100 runs, is what AMD's MI300X runs of vLLM 0.6.6
and 0.7.3 and dstack's of upstream 0.6.3 price too, so without Argonne it takes their fit, not the floor of its prior
(issue 79)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from meshplan_validation import loso_serving
from meshplan_validation.fitted import by_name
from meshplan_validation.provenance import record_source
from meshplan_validation.records import read_runs
from meshplan_validation.serving_eval import ServingResult

ROOT = Path(__file__).resolve().parents[1]
NAME = "vLLM V0 iteration_latency"


def _result(id_: str, metric: str, headline: bool, mode: str = "batch", predicted: float = 2.0) -> ServingResult:
    return ServingResult(id=id_, group="g", generation="Hopper", gpu="H100", split="dev", mode=mode, metric=metric,
                         measured=1.0, predicted=predicted, batch=1.0, headline=headline)


def test_the_judged_observation_is_the_headline_else_the_first_metric_of_a_run_not_driven_at_a_rate():
    rs = [_result("a", "ttft_ms", False), _result("a", "total_tokens_per_s", True),
          _result("b", "e2e_latency_ms", False), _result("b", "tpot_ms", False),
          _result("c", "itl_ms", False, mode="rate"), _result("d", "e2e_latency_ms", False, predicted=None)]
    judged = loso_serving.judged(rs)  # type: ignore[arg-type]
    assert [(r.id, r.metric) for r in judged] == [("a", "total_tokens_per_s"), ("b", "e2e_latency_ms")]


def test_the_search_finds_the_lowest_of_two_valleys_to_its_resolution():
    # a median over runs is bumpy: a narrow deep valley at 1 beside a broad shallow one at 2.5; golden-section search
    # alone from [0, 4] would follow its first two probes (1.53: 0.110, 2.47: 0.100) to the shallow one; the grid sees
    # the deep one
    def f(x: float) -> float:
        return min(0.3 * abs(x - 1.0), 0.1 + 0.01 * abs(x - 2.5))
    found = loso_serving.grid_golden(f, 0.0, 4.0)
    cell = 4.0 / loso_serving.GRID
    assert found == pytest.approx(1.0, abs=2 * cell * 0.618 ** loso_serving.GOLDEN_ROUNDS)
    assert loso_serving.grid_golden(lambda x: (x - 0.3) ** 2, 0.0, 4.0) == pytest.approx(0.3, abs=1e-3)
    assert loso_serving.grid_golden(lambda x: -x, 0.0, 4.0) == pytest.approx(4.0, abs=1e-3)  # at a bound


@pytest.fixture(scope="module")
def serving_records() -> list[dict]:
    files = ("published_serving", "small_work", "llm_inference_bench_dev", "dstack_mi300x")
    return [r for f in files for r in read_runs(ROOT / "data/serving" / f"{f}.jsonl")]


@pytest.fixture(scope="module")
def without_argonne(serving_records: list[dict]) -> dict[str, float]:
    return loso_serving.single_without("argonne_bench", serving_records)


def test_without_argonne_the_iteration_latency_is_amds_fit_near_argonnes(without_argonne: dict[str, float]) -> None:
    f = by_name(NAME)
    assert f.sources == {"argonne_bench"}
    value = without_argonne[NAME]
    lo, hi = loso_serving.ALTERNATE[NAME]
    assert lo <= value <= hi
    # another GPU, host, engine version and model read the same per-iteration latency: within 25 % of Argonne's H100
    # fit, ten times the prior's floor
    assert value == pytest.approx(f.value(), rel=0.25) and value > 5 * f.prior
    # the other single-source constants still fall to their priors
    assert without_argonne["vLLM ROCm skinny_gemm_rate"] == by_name("vLLM ROCm skinny_gemm_rate").prior


def test_the_fit_reads_amds_runs_better_than_the_prior_and_no_records_keep_the_prior(
        serving_records: list[dict], without_argonne: dict[str, float]) -> None:
    amd = [r for r in serving_records if record_source(r) == "amd_vllm"]

    def read(value: float) -> float:
        return statistics.median(abs(math.log1p(r.error)) for r in loso_serving.judged(
            loso_serving.priced(amd, {NAME: value})) if r.error is not None)
    assert read(without_argonne[NAME]) < read(by_name(NAME).prior)
    # no run among the records that the constant prices (TensorRT-LLM's, LMDeploy's): the prior, as before
    others = [r for r in serving_records if record_source(r) in ("trtllm_perf", "lmdeploy")][:40]
    assert loso_serving.single_without("argonne_bench", others)[NAME] == by_name(NAME).prior
    assert loso_serving.single_without("argonne_bench")[NAME] == by_name(NAME).prior
    # the alternate source's own runs keep the shipped value (fitted on Argonne alone)
    assert NAME not in loso_serving.single_without("amd_vllm", serving_records)


def test_a_longer_iteration_latency_never_speeds_an_alternate_run(serving_records: list[dict]) -> None:
    amd = [r for r in serving_records if record_source(r) == "amd_vllm"][:12]
    slow, fast = (loso_serving.judged(loso_serving.priced(amd, {NAME: v})) for v in (2e-3, 0.5e-3))
    assert all(s.predicted is not None and f.predicted is not None and s.predicted >= f.predicted
               for s, f in zip(slow, fast, strict=True))  # latencies: a longer loop never shortens them


def test_the_runs_a_constant_can_read_hold_every_run_that_pricing_twice_finds_it_moves(
        serving_records: list[dict]) -> None:
    # alternate_fit prices only loso_serving.reading's records at the bounds: the runs of the constant's engine presets
    # (GRACE: of a host at python_host >= 2), whole ids; the two-pricing definition over every record finds the same
    sample = serving_records[::15] + [r for s in ("amd_vllm", "dstack") for r in
                                      [r for r in serving_records if record_source(r) == s][:5]]
    for name, (lo, hi) in ((NAME, loso_serving.ALTERNATE[NAME]), (loso_serving.GRACE, (0.0, 3.0))):
        cheap = loso_serving.reading(name, sample)
        moved = loso_serving.moving(name, sample, lo, hi)
        assert loso_serving.moving(name, cheap, lo, hi) == moved
        assert len(cheap) < len(sample) / 2  # the selection leaves most runs unpriced
    assert loso_serving.moving(NAME, sample, 0.0, 4e-3)  # the sample holds runs it moves (AMD's, dstack's)
