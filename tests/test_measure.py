"""The parts of check-step that need no run: signatures, reuse distances, fusion chains, the non-negative fits,
the prediction's arithmetic, the per-op records and the learned model's bookkeeping (meshplan.measure)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from meshplan.calibrate.fit import linear_fit, nnls
from meshplan.measure.host import HostCosts
from meshplan.measure.predict import predict_peak, predict_step
from meshplan.measure.reuse import reuse_distances, step_distances
from meshplan.measure.signature import signature_key, signatures
from meshplan.trace.classes import op_class
from meshplan.trace.fusion import fused, fusion_groups
from meshplan.trace.graph import Storage, TensorInfo, Trace, TracedOp

F32 = 4


def t(storage: int, *shape: int) -> TensorInfo:
    return TensorInfo(shape=shape, dtype="float32", itemsize=F32, storage=storage,
                      stride=tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))


def op(index: int, target: str, ins: list[TensorInfo], outs: list[TensorInfo], *, kind: str = "memory",
       phase: str = "fwd", tags: tuple[str, ...] = ("pointwise",), flops: float = 0.0) -> TracedOp:
    read = float(sum(x.nbytes for x in ins))
    written = float(sum(x.nbytes for x in outs))
    return TracedOp(index=index, name=f"m/{target.split('.')[1]}", target=target, phase=phase, kind=kind,
                    inputs=tuple(ins), outputs=tuple(outs), flops=flops, flops_source="meshplan", bytes_read=read,
                    bytes_written=written, call=json.dumps([[{"tensor": i} for i in range(len(ins))], {}]),
                    tags=tags)


def chain() -> list[TracedOp]:
    """x -mm-> a -mul-> b -add-> c -sum-> d -mm-> e: a GEMM, two pointwise ops, a reduction, a GEMM."""
    x, w, a, b, c, d, e = (t(0, 8, 8), t(1, 8, 8), t(2, 8, 8), t(3, 8, 8), t(4, 8, 8), t(5, 8), t(6, 8, 8))
    return [op(0, "aten.mm.default", [x, w], [a], kind="gemm", tags=(), flops=2 * 8**3),
            op(1, "aten.mul.Tensor", [a, a], [b], flops=64),
            op(2, "aten.add.Tensor", [b, x], [c], flops=64),
            op(3, "aten.sum.dim_IntList", [c], [d], tags=("reduction",), flops=64),
            op(4, "aten.mm.default", [c, w], [e], kind="gemm", tags=(), flops=2 * 8**3)]


def test_signatures_group_identical_calls():
    ops = chain()
    again = op(5, "aten.mul.Tensor", [t(7, 8, 8), t(8, 8, 8)], [t(9, 8, 8)], flops=64)  # mul of the same shapes
    sigs = signatures([*ops, again])
    # 5 distinct calls: mm (twice, but with different inputs' storages only: one key), mul (ops 1 and 5), add, sum
    assert signature_key(ops[1]) == signature_key(again)
    by_target = {s.target: s.indices for s in sigs}
    assert by_target["aten.mul.Tensor"] == (1, 5) and by_target["aten.mm.default"] == (0, 4)
    assert sum(s.count for s in sigs) == 6 and all(s.replayable for s in sigs)


def test_reuse_distance_counts_the_bytes_in_between():
    ops = chain()  # every tensor 8x8 fp32 = 256 B except d (32 B); op bytes: mm 768, mul 768, add 768, sum 288
    d = reuse_distances(ops)
    # op 1 (mul) reads a, written by op 0 just before: nothing in between
    assert d[1] == 0.0
    # op 2 (add) reads b (just written: 0) and x (last touched by op 0 a step-cycle later: mul 768 in between);
    # byte-weighted mean of (0, 768) over two 256-B inputs = 384
    assert d[2] == pytest.approx(384.0)
    # op 4 reads c (last read by op 3, just before: 0) and w (op 0; mul + add + sum = 768 + 768 + 288 = 1824)
    assert d[4] == pytest.approx((0 + 1824) / 2)
    # cyclic: op 0 reads x and w, last touched by op 4 (w) and op 2 (x) of the previous step
    assert d[0] == pytest.approx(((288 + 768) + 0) / 2)
    # optimizer ops: what existed before sits a whole step away
    opt = [op(0, "aten.mul_.Tensor", [t(50, 8, 8)], [t(50, 8, 8)], phase="opt")]
    assert step_distances(ops, opt)[-1] == sum(o.nbytes for o in ops) + opt[0].nbytes


def test_pointwise_chains_fuse_up_to_a_reduction_and_not_across_gemms():
    ops = chain()
    groups = fusion_groups(ops)
    assert groups[0] == -1 and groups[4] == -1  # GEMMs are extern kernels
    assert groups[1] == groups[2] == groups[3] >= 0  # mul → add → sum: one kernel
    (g,) = fused(ops, groups)
    # reads a (256) and x (256) from memory; writes c (read by the second GEMM: 256); b stays inside, and d, which
    # no later op reads, need not be written at all
    assert g.bytes_read == 512 and g.bytes_written == 256 and g.ops == (1, 2, 3)
    eager = sum(ops[i].nbytes for i in g.ops)
    assert eager == 768 + 768 + 288 and g.nbytes < eager


def test_phases_do_not_fuse():
    a, b, c = t(0, 4), t(1, 4), t(2, 4)
    ops = [op(0, "aten.mul.Tensor", [a], [b]), op(1, "aten.mul.Tensor", [b], [c], phase="bwd_x")]
    assert fusion_groups(ops)[0] != fusion_groups(ops)[1]


def test_op_classes():
    ops = chain()
    assert [op_class(o) for o in ops] == ["gemm", "pointwise", "pointwise", "reduction", "gemm"]
    assert op_class(op(0, "aten.native_layer_norm.default", [], [], tags=())) == "norm"
    assert op_class(op(0, "aten.bernoulli_.float", [], [], tags=())) == "random"


def test_nnls_never_returns_a_negative_latency():
    sizes = [1e4, 1e5, 1e6, 1e7]
    # a line through a negative intercept: t = -2 us + n / 1 GB/s (8 us at 10 kB)
    times = [-2e-6 + n / 1e9 for n in sizes]
    fit = linear_fit(sizes, times)
    assert fit.intercept == 0.0 and fit.slope > 0 and fit.bounded
    # noise-free points with non-negative terms are recovered exactly: t = 5 us + n / 10 GB/s
    exact = linear_fit(sizes, [5e-6 + n / 1e10 for n in sizes])
    assert exact.intercept == pytest.approx(5e-6) and exact.slope == pytest.approx(1e-10)
    assert exact.r2 == pytest.approx(1.0) and exact.residual_max < 1e-9 and not exact.bounded
    # three columns: t = 1 us + 2e-10·bytes + 0·flops
    rows = [(1e3, 5e3), (1e5, 1e4), (1e6, 1e7), (1e7, 1e3)]
    three = nnls([[1.0] * 4, [r[0] for r in rows], [r[1] for r in rows]], [1e-6 + 2e-10 * b for b, _ in rows])
    assert three.coefs == pytest.approx((1e-6, 2e-10, 0.0), abs=1e-15)


def trace_of(ops: list[TracedOp]) -> Trace:
    storages = {}
    for o in ops:
        for x in (*o.inputs, *o.outputs):
            storages.setdefault(x.storage, Storage(id=x.storage, nbytes=x.nbytes, role="activation",
                                                   created=o.index))
    storages[0] = Storage(id=0, nbytes=256, role="input")
    storages[1] = Storage(id=1, nbytes=256, role="param")
    return Trace(name="chain", ops=tuple(ops), storages=storages, params=64, param_bytes=256, forward_end=4,
                 module_calls=3)


def test_prediction_adds_kernels_and_host_work():
    ops = chain()
    times = {s.key: (i + 1) * 1e-6 for i, s in enumerate(signatures(ops))}  # mm 1 us (both), mul 2, add 3, sum 4
    host = HostCosts(autograd=0.5e-6, engine=1.5e-6, module=1e-6)
    pred = predict_step(trace_of(ops), [], times, host)
    # kernels: mm 1 + mul 2 + add 3 + sum 4 + mm 1 (same signature as op 0) = 11 us
    assert pred.kernels == pytest.approx(11e-6)
    # host: 5 forward ops with a float result × (0.5 + 1.5) us + 3 module calls × 1 us = 13 us
    assert pred.host_seconds == pytest.approx(13e-6)
    assert pred.seconds == pytest.approx(24e-6) and all(p.source == "replay" for p in pred.ops)
    # on a GPU the host issues while kernels run: max(11, 13 + 4 launches… every op is one kernel: 5 × 0) us
    gpu = predict_step(trace_of(ops), [], times, host, serial=False)
    assert gpu.seconds == pytest.approx(max(11e-6, 13e-6))
    # an op not replayed takes its class's fit (3 points at least); without one, the median replayed op:
    # the upper median of the other ops' 1, 2, 4, 1 us is 2 us
    missing = dict(times)
    missing[signature_key(ops[2])] = math.nan
    fallback = predict_step(trace_of(ops), [], missing, host)
    assert fallback.ops[2].source == "fit" and fallback.ops[2].kernel == pytest.approx(2e-6)


def test_peak_adds_a_kernels_workspace():
    ops = chain()
    tr = trace_of(ops)
    base = predict_peak(tr, [])
    ws = {signature_key(ops[4]): 10_000}  # the second GEMM allocates 10 kB inside itself
    assert predict_peak(tr, [], workspace=ws) >= base
    from meshplan.trace.liveness import peak_memory

    timeline = peak_memory(tr, "adamw").timeline
    assert predict_peak(tr, [], workspace=ws) == max(base, timeline[4] + 10_000)


def test_records_features_and_weighted_median():
    from meshplan_research.features import NAMES, matrix, vocabulary
    from meshplan_research.learned import _weighted_median, fit_roofline, roofline_time

    recs = [{"record": "op", "model": "m", "target": "aten.mul.Tensor", "phase": "fwd", "cls": "pointwise",
             "kind": "memory", "flops": 100.0 * i * i, "bytes_read": 1e3 * i, "bytes_written": 5e2 * i,
             "inputs": ["10x10:float32"], "outputs": ["10x10:float32"], "m": 0, "n": 0, "k": 0, "groups": 1,
             "distance": 1e4, "group": -1, "group_ops": 1, "launches": 1, "source": "replay",
             "replay_s": 1e-6 + 1e-9 * 1.5e3 * i, "host_s": 0.0, "measured_s": 2e-6 * i} for i in range(1, 5)]
    x = matrix(recs, vocabulary(recs))
    assert x.shape == (4, len(NAMES)) and np.isfinite(x[:, :-1]).all() and (x[:, -1] == 0).all()
    fits = fit_roofline(recs)  # t = 1 us + 1 ns per byte, exactly
    assert fits["pointwise"] == pytest.approx((1e-6, 1e-9, 0.0), abs=1e-14)
    assert roofline_time(recs[0], fits) == pytest.approx(recs[0]["replay_s"])
    # weights 1, 1, 10: the heavy value is the median
    assert _weighted_median([(0.1, 1.0), (0.5, 1.0), (0.3, 10.0)]) == 0.3
