"""The step's Python glue (measure/glue.py) measured on a module whose glue is known, and the prediction's use of
it (measure/predict.py): the glue lengthens a predicted step by what exceeds the module calls, never shortens it."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from meshplan.measure.host import HostCosts
from meshplan.measure.predict import predict_step
from meshplan.measure.signature import signatures
from test_measure import chain, trace_of

torch = pytest.importorskip("torch")

BURN = 2e-3  # seconds of pure Python between the module's two ops


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Burner(torch.nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.seconds = seconds

    def forward(self, x):
        y = self.lin(x)
        _burn(self.seconds)
        return (y * 2).sum()


def _glue(seconds: float):
    from meshplan.measure.glue import measure_glue

    model, x = Burner(seconds), torch.ones(4, 8)

    def step() -> None:
        model(x).backward()

    step()
    return measure_glue(step)


def test_the_glue_is_the_python_between_ops():
    plain, burnt = _glue(0.0), _glue(BURN)
    # four top-level calls reach aten (F.linear, Tensor.__mul__, .sum(), .backward()) in both; the burn adds the
    # 2 ms busy loop to the gap between F.linear and the multiply: burnt − plain = 2 ms (± 0.3 ms: the loop's
    # last thread_time read overshoots by one read, the shared host's noise)
    assert burnt.op_calls == plain.op_calls == 4
    assert burnt.seconds - plain.seconds == pytest.approx(BURN, abs=0.3e-3)
    # the step's other glue (two nn.Module calls, the burn's call, the test's closure) is tens of µs, not ms (up to
    # 0.22 ms measured with both of a 2-core CI machine's cores busy with the suite's workers)
    assert 0.0 <= plain.seconds < 0.5e-3
    # the mode's own cost per call is taken out: one to a few µs per call on this host
    assert 0.1e-6 < plain.op_overhead < 20e-6 and 0.1e-6 < plain.empty_overhead < 20e-6


@pytest.mark.parametrize("serial", [True, False])
def test_glue_never_shortens_a_step_and_adds_what_exceeds_the_module_calls(serial):
    ops = chain()
    times = {s.key: (i + 1) * 1e-6 for i, s in enumerate(signatures(ops))}  # mm 1 us (both), mul 2, add 3, sum 4
    host = HostCosts(autograd=0.5e-6, engine=1.5e-6, module=1e-6, dispatch=0.5e-6)
    pred = predict_step(trace_of(ops), [], times, host, serial=serial)
    steps = [replace(pred, glue=g * 1e-6).seconds for g in (0, 1, 3, 10, 30, 100)]
    assert steps == sorted(steps)
    # 3 module calls × 1 us are already priced: a glue of 3 us adds nothing, one of 100 us adds 97 us
    assert replace(pred, glue=3e-6).seconds == pytest.approx(pred.seconds)
    if serial:  # a CPU prediction leaves the glue out (predict.py): kernels 11 + host 13 us (test_measure)
        assert replace(pred, glue=100e-6).seconds == pytest.approx((11 + 13) * 1e-6)
    else:  # GPU: 5 launching ops, 11 − 5 × 0.5 = 8.5 us of kernels; host 13 + 5 × 0.5 + 97 = 112.5 us
        assert pred.gpu_timeline == pytest.approx(8.5e-6)
        assert replace(pred, glue=100e-6).seconds == pytest.approx(112.5e-6)


@pytest.mark.parametrize("glue", [0.0, 2e-6, 100e-6])
def test_the_host_bound_split_is_the_prediction_on_a_gpu(glue):
    """hostbound.host_bound on a GPU prediction adds up to what predict.py predicts: max(work, dispatch + host), the
    ops that launch no kernel (views) on the host's side as in predict.py's host timeline, the glue beyond the module
    calls with them. The chain of test_measure has 5 launching ops (kernels 11 us, 8.5 us after their dispatch);
    with a view of 20 us among them the split put it in the work (8.5 + 20 = 28.5 us against a host of 13 + 2.5 us)
    where the prediction has it on the host (host 13 + 2.5 + 20 = 35.5 us)."""
    from meshplan.measure.hostbound import host_bound
    from meshplan.measure.predict import OpPrediction

    ops = chain()
    times = {s.key: (i + 1) * 1e-6 for i, s in enumerate(signatures(ops))}
    host = HostCosts(autograd=0.5e-6, engine=1.5e-6, module=1e-6, dispatch=0.5e-6)
    pred = replace(predict_step(trace_of(ops), [], times, host, serial=False), glue=glue)
    first = pred.ops[0]
    view = OpPrediction(index=len(pred.ops), op=first.op, cls="view", kernel=20e-6, host=0.0, source="replay",
                        launches=0)
    for p in (pred, replace(pred, ops=(*pred.ops, view))):
        assert host_bound(p).with_host == pytest.approx(p.seconds, rel=1e-12)
