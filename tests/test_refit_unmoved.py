"""A refitted constant that none of the kept observations reads falls to its prior (refit.Linear ``unmoved``,
loso_serving.refit_without, loso_training.EfficiencyRefit.without; issue 79): nothing in the objective places it, so a
minimiser would leave it wherever its search stopped (TensorRT-LLM's iteration overhead drifted to its 10 ms bound
when its one responsive source was left out: notes of the trtload change)."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.specs.efficiency import DEFAULT
from meshplan_validation import loso_serving, loso_training
from meshplan_validation.fitted import by_name
from meshplan_validation.refit import Coordinate, Linear
from meshplan_validation.robust_loss import SERVING, TRAINING, Loss


def _linear(coords: tuple[Coordinate, ...], sources: list[str], jacobian: list[list[float]],
            x0: list[float], loss: Loss) -> Linear:
    """Observations measured at their base predictions but one: a miss that the first coordinate's readers pull on."""
    n = len(sources)
    base = np.zeros(n)
    measured = np.where(np.arange(n) == 0, 0.1, 0.0)
    return Linear(coords=coords, x0=np.array(x0), base=base, measured=measured, groups=np.array(sources),
                  sources=np.array(sources), jacobian=np.array(jacobian, float), loss=loss)


def test_unmoved_names_the_constants_no_kept_observation_reads():
    coords = (Coordinate("a", (0.1, 1.0)), Coordinate("b", (0.0, 1.0), log=False, step=0.1))
    linear = _linear(coords, ["s", "s", "t"], [[1.0, 0.0], [0.5, 0.0], [0.2, 2.0]], [0.0, 0.5], SERVING)
    assert linear.unmoved(None) == frozenset()
    assert linear.unmoved("t") == {"b"}  # only t's run reads b
    assert linear.unmoved("s") == frozenset()
    # a free constant nothing reads takes its prior; one that is read is refitted; one without a prior stays put
    found = linear.refit("t", priors={"b": 0.0})
    assert found["b"] == 0.0 and found["a"] != pytest.approx(1.0)
    # where some kept run reads it, the prior changes nothing
    assert linear.refit("s", priors={"b": 0.0}) == linear.refit("s")
    # a constant held (not free) keeps its start even where unread
    assert linear.refit("t", free=["a"], priors={"b": 0.0})["b"] == pytest.approx(0.5)


def test_a_serving_constant_whose_kept_runs_do_not_price_it_falls_to_its_prior():
    # kv_read is listed on every fit source; here only trtllm_perf's observation reads it: without trtllm_perf the
    # refit has nothing to place it by, so it falls to its prior (1.0), not to wherever Powell stops
    sources = ["trtllm_perf", "lmdeploy", "sglang_blogs"]
    width = len(loso_serving.COORDS)
    jac = [[0.0] * width for _ in sources]
    jac[0][0] = 1.0  # trtllm_perf reads kv_read
    jac[1][1] = jac[2][1] = 1.0  # the others read experts
    values = loso_serving.shipped()
    linear = _linear(loso_serving.COORDS, sources, jac, [c.to_x(values[c.name]) for c in loso_serving.COORDS],
                     SERVING)
    out = loso_serving.refit_without(linear, "trtllm_perf")
    assert out["kv_read"] == by_name("kv_read").prior
    assert out["trtllm"] == by_name("trtllm iteration_overhead").prior  # its only source: as before
    assert out["lmdeploy"] == values["lmdeploy"]  # not fitted on trtllm_perf: shipped
    assert loso_serving.refit_without(linear, "lmdeploy")["kv_read"] != by_name("kv_read").prior


def test_a_training_constant_whose_kept_runs_do_not_price_it_falls_to_its_prior():
    # attention read by torchtitan's run alone: without torchtitan it takes its prior; gemm, read by all, is refitted
    sources = ["torchtitan", "mosaicml", "nemo"]
    x0 = [c.to_x(getattr(DEFAULT, c.name)) for c in loso_training.DENSE]
    linear = _linear(loso_training.DENSE, sources, [[1.0, 0.3], [1.0, 0.0], [1.0, 0.0]], x0, TRAINING)
    refit = loso_training.EfficiencyRefit(linear)
    out = refit.without("torchtitan")
    assert out["attention"] == by_name("attention").prior
    # gemm is refitted, not put at its prior: the kept runs sit on their predictions, so it stays where it was
    assert out["gemm"] == pytest.approx(DEFAULT.gemm, rel=1e-4) and by_name("gemm").prior != pytest.approx(DEFAULT.gemm)
    assert refit.without("mosaicml")["attention"] != by_name("attention").prior
    # a source neither is fitted on keeps both shipped
    assert refit.without("vtrain") == {"gemm": DEFAULT.gemm, "attention": DEFAULT.attention}
