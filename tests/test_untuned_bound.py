"""The prior of the untuned hipBLASLt builds' GEMM rate (vLLM ROCm skinny_gemm_rate without Argonne's runs), read from
Nscale's "up to 7.2x" with the model's own decode step (meshplan_validation/untuned_bound.py, issue 79): tuning speeds
the GEMMs and nothing else, so the 7.2x run's untuned rate r solves T(r) = 7.2 T(1) at its configuration, and is at
most the largest root over the configurations a V0 run on MI300X can take."""

from __future__ import annotations

import pytest

from meshplan_validation.fitted import UNTUNED_GEMM_PRIOR, UNTUNED_GEMM_STEP_PRIOR, by_name
from meshplan_validation.untuned_bound import BATCH, at_priors, loosest, rate_for, step


@pytest.fixture(scope="module")
def bound():
    return loosest()


def test_the_prior_is_the_loosest_root_llama_3_70bs_step_on_one_mi300x(bound):
    rate, preset, model = bound
    assert (preset, model) == ("vllm-v0", "llama3-70b")
    assert rate == pytest.approx(UNTUNED_GEMM_STEP_PRIOR, abs=5e-5)
    assert by_name("vLLM ROCm skinny_gemm_rate").prior == UNTUNED_GEMM_STEP_PRIOR


def test_the_roots_arithmetic():
    """Llama 3 70B, 256 sequences, one token of context, one MI300X, vLLM V0 0.6 at the priors: the step is 91.0 ms
    with its GEMMs at the modelled rate, 67.7 ms of them the 256 x 139.0 GFLOP of GEMMs (525 TFLOP/s) and 23.3 ms the
    rest, which tuning does not touch (15.2 ms of it the host's 256 sequences; the gaps between the 80 layers' kernels,
    the memory-bound ops, the LM head's sampling). At 0.1012 of that rate the GEMMs take 631.8 ms and the step
    655.1 ms = 7.2 x 91.0; a step all GEMM would need 1 / 7.2 = 0.1389."""
    engine = at_priors("vllm-v0")
    tuned, untuned = step("llama3-70b", engine, 1.0), step("llama3-70b", engine, UNTUNED_GEMM_STEP_PRIOR)
    assert tuned == pytest.approx(0.0910, abs=5e-4)
    assert untuned / tuned == pytest.approx(7.2, rel=2e-3)
    assert UNTUNED_GEMM_STEP_PRIOR < UNTUNED_GEMM_PRIOR == round(1 / 7.2, 4)


def test_every_other_configuration_gives_a_lower_root(bound):
    """The bound's configuration is the most GEMM-bound: splitting the GEMMs over two GPUs, fewer sequences, a smaller
    model or a build with more host time per step each leave more of the step outside the GEMMs, and lower the root."""
    engine = at_priors("vllm-v0")
    rate = bound[0]
    others = {"tp 2": rate_for("llama3-70b", engine, tp=2), "128 sequences": rate_for("llama3-70b", engine,
                                                                                       batch=BATCH // 2),
              "Llama 2 7B": rate_for("llama2-7b", engine), "V0 0.5": rate_for("llama3-70b", at_priors("vllm-v0.5")),
              "ROCm v0.6.1": rate_for("llama3-70b", at_priors("vllm-v0.6-rocm"))}
    expected = {"tp 2": 0.065, "128 sequences": 0.079, "Llama 2 7B": 0.039, "V0 0.5": 0.093, "ROCm v0.6.1": 0.1007}
    for name, value in others.items():
        assert value == pytest.approx(expected[name], abs=0.002), name
        assert value <= rate, name


def test_a_larger_gain_means_a_slower_untuned_library():
    engine = at_priors("vllm-v0")
    rates = [rate_for("llama3-70b", engine, speedup) for speedup in (2.0, 4.0, 7.2, 10.0)]
    assert all(a > b for a, b in zip(rates, rates[1:], strict=False))
