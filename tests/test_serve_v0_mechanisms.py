"""vLLM V0's mechanisms that LLM-Inference-Bench's released runs showed (issue 79, deliverable 3;
data/serving/llm_inference_bench_dev.jsonl): the time per iteration a CPU measurement of the engine loop leaves out,
Grace running that interpreter-bound loop at its measured interpreter speed, and the kernels of vLLM's ROCm build of
2024: its hipified paged attention reading a KV head once per query head, each read from HBM on a GPU whose dies keep
L2s of their own; its untuned GEMMs at decode's rows; the GPU's idle time between the kernels of a step. Each test shows
its arithmetic; tests/test_serve_properties.py draws the monotonicity of each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.decode import gemm
from meshplan.roofline import op_time, overhead
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.iteration import cache_read_time, gap_time, layouts, op_seconds, shaped_seconds, stage_ops
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.host_cost import EAGER_OP_HOST
from meshplan.specs.model_load import load_model

FP16 = Quant(weights="fp16", activations="fp16", kv_cache="fp16")
WORK = Workload(input_len=512, output_len=512, static=True)


def setting(engine: str, system: str, model: str = "llama2-7b", tp: int = 1, batch: int = 16) -> Setting:
    plan = ServePlan(tp=tp, batch=batch, quant=FP16)
    return Setting(load_model(model), load_system(system).cluster(tp), plan_columns(plan), FP16, load_engine(engine),
                   WORK)


def test_a_v0_iteration_adds_its_latency_whatever_the_host():
    """vLLM V0 0.6: 0.323 ms + 58.2 us a sequence of interpreter-bound host loop, at the host's interpreter speed, and
    1.115 ms per iteration of GPU work beside the forward pass that no host speed sets (presets/engines/vllm-v0.toml).
    On GH200 the loop runs at Grace's interpreter speed, 39 / 34 = 1.15 an x86 host's (hardware/gh200.toml
    interpreter_host: NVIDIA's dgxc-benchmarking CPU-overhead test), not at the 2.46x of PyTorch's dispatch there,
    which TensorRT-LLM's PyTorch backend's loop still pays (host_in_python, not interpreted)."""
    v0 = load_engine("vllm-v0")
    h100, gh200 = load_system("h100").cluster(1), load_system("gh200").cluster(1)
    assert (v0.host_interpreted, v0.iteration_latency) == (True, pytest.approx(1.115e-3))
    assert (gh200.python_host, gh200.interpreter_speed, h100.interpreter_speed) == (2.46, 1.15, 1.0)
    loop = 0.323e-3 + 16 * 58.2e-6
    assert v0.host_time(16, 1, v0.loop_speed(h100)) == pytest.approx(loop)
    assert v0.host_time(16, 1, v0.loop_speed(gh200)) == pytest.approx(1.15 * loop)
    trt = load_engine("trtllm-pytorch")
    assert trt.loop_speed(gh200) == 2.46 and not trt.host_interpreted
    # an x86 host without an interpreter figure of its own: its Python figure (A100's 1.34)
    a100 = load_system("a100").cluster(1)
    assert v0.loop_speed(a100) == a100.python_host == 1.34
    # in a step, beside the forward: the loop (at 1.15x on GH200) and the iteration's 1.115 ms, which no host speed sets
    s_h, s_g = setting("vllm-v0", "h100"), setting("vllm-v0", "gh200")
    host_h = float(s_h.time(16.0)) - float(s_h.gpu_time(16.0, 0.0, 0.0, 0.0))
    host_g = float(s_g.time(16.0)) - float(s_g.gpu_time(16.0, 0.0, 0.0, 0.0))
    assert host_h == pytest.approx(loop + 1.115e-3) and host_g == pytest.approx(1.15 * loop + 1.115e-3)
    bare = replace(s_h, engine=v0.with_(iteration_latency=0.0))
    assert float(s_h.time(16.0)) == pytest.approx(float(bare.time(16.0)) + 1.115e-3)


def test_the_hipified_paged_attention_reads_each_kv_head_once_per_query_head_from_hbm_on_mi300x():
    """Llama 2 70B at tp 1: 64 query heads over 8 KV heads, 8 reads of each KV head by the ROCm build's kernel (one
    thread block per query head). MI300X's 8 XCDs each keep their own L2 and get the workgroups round-robin, so all
    min(8, 8) = 8 reads come from HBM: the attention costs what 8 times its bytes cost; on a one-die GPU (no L2 figure)
    the repeats are free, as before."""
    s = setting("vllm-v0.6-rocm", "mi300x", "llama2-70b")
    sh = s.shape(16.0, 0.0, 0.0, 0.0)
    assert sh.per_query_head
    (op,) = [o for o, _ in stage_ops(s.model, sh, 1) if o.name == "attn/decode"]
    assert op.repeat == 8.0
    acc = s.cluster.accelerator
    assert acc.l2_dies == 8 and not acc.l2_bandwidth
    eight = op_time(replace(op, nbytes=8 * op.nbytes), acc, "fp16", SERVE_DEFAULT.cache_reads)
    assert cache_read_time(op, acc, "fp16", SERVE_DEFAULT) == pytest.approx(eight)
    one_die = replace(acc, l2_dies=1)
    once = op_time(op, acc, "fp16", SERVE_DEFAULT.cache_reads)
    assert cache_read_time(op, one_die, "fp16", SERVE_DEFAULT) == pytest.approx(once)
    assert eight > 6 * once  # the bytes dominate: nearly 8x
    # a group of 16 query heads on 8 dies: 8 reads from HBM, the other 8 from the dies' L2s (no L2 figure: free)
    assert cache_read_time(replace(op, repeat=16.0), acc, "fp16", SERVE_DEFAULT) == pytest.approx(eight)


def test_the_rocm_builds_untuned_gemms_run_decode_rows_at_their_share():
    """vllm-v0.6-rocm: a GEMM of at most 256 rows at skinny_gemm_rate of the modelled rate (the modelled GEMM
    efficiency times that share); a prefill's 4,096 rows at the modelled rate; 257 rows never faster than 256."""
    engine = load_engine("vllm-v0.6-rocm")
    s = setting("vllm-v0.6-rocm", "mi300x")
    rate = engine.skinny_gemm_rate
    assert engine.skinny_gemm_rows == 256 and 0 < rate < 0.2
    place = layouts(1, 1, 1)
    slow = replace(SERVE_DEFAULT, gemm=SERVE_DEFAULT.gemm * rate)
    for rows in (1.0, 64.0, 256.0):
        sh = s.shape(rows, 0.0, 0.0, 0.0)
        op = gemm("mlp/down", rows, 11008, 4096, 2, 2)
        assert shaped_seconds(op, s.cluster, FP16, SERVE_DEFAULT, place, sh) == pytest.approx(
            op_seconds(op, s.cluster, FP16, slow, place))
    # a prefill of 16,384 rows at the modelled rate: longer than its first 256 rows at the share
    big = s.shape(0.0, 16384.0, 32.0, 0.0)
    op = gemm("mlp/down", 16384, 11008, 4096, 2, 2)
    assert shaped_seconds(op, s.cluster, FP16, SERVE_DEFAULT, place, big) == pytest.approx(
        op_seconds(op, s.cluster, FP16, SERVE_DEFAULT, place))
    # 4,096 rows: the modelled rate would take less than the first 256 rows at the share; that floor holds
    op = gemm("mlp/down", 4096, 11008, 4096, 2, 2)
    first = gemm("mlp/down", 256, 11008, 4096, 2, 2)
    floor = op_seconds(replace(first, nbytes=op.nbytes), s.cluster, FP16, slow, place)
    assert shaped_seconds(op, s.cluster, FP16, SERVE_DEFAULT, place, s.shape(0.0, 4096.0, 8.0, 0.0)) == pytest.approx(
        max(op_seconds(op, s.cluster, FP16, SERVE_DEFAULT, place), floor))
    at = {rows: shaped_seconds(gemm("mlp/down", rows, 11008, 4096, 2, 2), s.cluster, FP16, SERVE_DEFAULT, place,
                               s.shape(rows, 0.0, 0.0, 0.0)) for rows in (255.0, 256.0, 257.0, 400.0)}
    assert at[255.0] <= at[256.0] <= at[257.0] <= at[400.0]
    # the CUDA build's preset prices the same GEMM at the modelled rate
    cuda = setting("vllm-v0", "mi300x")
    sh = cuda.shape(64.0, 0.0, 0.0, 0.0)
    op = gemm("mlp/down", 64.0, 11008, 4096, 2, 2)
    assert shaped_seconds(op, cuda.cluster, FP16, SERVE_DEFAULT, place, sh) == pytest.approx(
        op_seconds(op, cuda.cluster, FP16, SERVE_DEFAULT, place))


def test_the_gpu_idles_kernel_gap_between_the_kernels_of_a_step():
    """vllm-v0.6-rocm on MI300X, Llama 2 7B at tp 2: kernel_gap seconds for every kernel the step's ops launch (32
    layers of GEMMs, norms, rotary, cache write, attention, activation, two all-reduces, and the edges), added to the
    GPU's step and shown as its own row of the breakdown."""
    engine = load_engine("vllm-v0.6-rocm")
    s = setting("vllm-v0.6-rocm", "mi300x", tp=2)
    sh = s.shape(16.0, 0.0, 0.0, 0.0)
    kernels = sum(count * (1.0 if op.kind == "collective" else max(op.kernels, op.launches))
                  for op, count in stage_ops(s.model, sh, 1)
                  if (op.flops > 0 or op.nbytes > 0) and (op.kind != "collective" or op.collective.group > 1))
    assert 32 * 10 < kernels < 32 * 16
    gaps = gap_time(s.model, s.cluster, sh, 1, engine)
    assert gaps == pytest.approx(engine.kernel_gap * kernels)
    bare = replace(s, engine=engine.with_(kernel_gap=0.0))
    assert float(s.gpu_time(16.0, 0.0, 0.0, 0.0)) == pytest.approx(float(bare.gpu_time(16.0, 0.0, 0.0, 0.0)) + gaps)
    est = serve_estimate(s.model, s.cluster, ServePlan(tp=2, batch=16, quant=FP16), WORK, engine)
    assert est.breakdown["engine/gaps"] == pytest.approx(gaps)
    # one GPU: no all-reduce, so no gap for it
    one = setting("vllm-v0.6-rocm", "mi300x", tp=1)
    sh1 = one.shape(16.0, 0.0, 0.0, 0.0)
    assert gap_time(one.model, one.cluster, sh1, 1, engine) < gaps


def test_the_rocm_builds_all_reduces_run_rccl_at_rcclss_tuners_price():
    """vLLM's ROCm build up to v0.6.1 has no custom all-reduce on ROCm: RCCL runs the tensor-parallel all-reduces, at
    RCCL's own tuner's price (12 us + 0.8 us a step for LL on an MI300X node); an engine with its own kernel keeps
    NCCL's protocols in its stead. Llama 2 7B, tp 8, 16 sequences: 2 all-reduces of 16 x 4096 x 2 bytes a layer."""
    engine = load_engine("vllm-v0.6-rocm")
    assert engine.engine_all_reduce is False and load_engine("vllm-v0.5-rocm").engine_all_reduce is False
    assert load_engine("vllm-v0").engine_all_reduce is True and load_engine("sglang").engine_all_reduce is True
    s = setting("vllm-v0.6-rocm", "mi300x", tp=8)
    sh = s.shape(16.0, 0.0, 0.0, 0.0)
    ars = [(op, count) for op, count in stage_ops(s.model, sh, 1)
           if op.kind == "collective" and op.collective.kind == "all_reduce"]
    assert ars and {op.collective.nbytes for op, _ in ars} == {16 * 4096 * 2}
    place = layouts(8, 1, 1)
    rccl = sum(count * shaped_seconds(op, s.cluster, s.quant, s.eff, place, sh) for op, count in ars)
    own = replace(sh, engine_all_reduce=True)
    stand_in = sum(count * shaped_seconds(op, s.cluster, s.quant, s.eff, place, own) for op, count in ars)
    per_call = 12e-6 + 14 * 0.8e-6  # RCCL's LL ring, before its bytes
    assert rccl >= sum(count for _, count in ars) * per_call > stand_in
    # and the whole step with it
    assert float(s.gpu_time(16.0, 0.0, 0.0, 0.0)) > float(replace(s, engine=engine.with_(
        engine_all_reduce=True)).gpu_time(16.0, 0.0, 0.0, 0.0))


def test_the_released_half_of_llm_inference_bench_is_read_as_its_engines_ran():
    """data/serving/llm_inference_bench_dev.jsonl (data/serving/README.md): 341 runs, split dev, each measuring total
    tokens/s and the batch's latency; the H100 runs ("pip install vllm", September 2024) read as V0 0.6 by their date,
    GH200's 0.5.3 as V0 0.5, MI300X's v0.6.1 ROCm build as its own preset; every run is priced."""
    import json
    from collections import Counter
    from pathlib import Path

    from meshplan_validation.serving_map import case_of

    path = Path(__file__).resolve().parents[1] / "data" / "serving" / "llm_inference_bench_dev.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(records) == len({r["id"] for r in records}) == 341
    assert {r["split"] for r in records} == {"dev"}
    assert all(r["measured"]["total_tokens_per_s"] > 0 and r["measured"]["e2e_latency_ms"] > 0 for r in records)
    presets = Counter((r["hardware"]["preset"], case_of(r).engine.name) for r in records)
    assert presets == {("h100", "vllm-v0"): 81, ("gh200", "vllm-v0.5"): 20, ("mi300x", "vllm-v0.6-rocm"): 240}


def test_under_tp_the_driver_broadcasts_its_nine_input_tensors_every_iteration():
    """vLLM V0 (0.5-0.6) at tp > 1: the driver broadcasts the model input's 9 GPU tensors to the other workers each
    iteration (broadcast_tensor_dict; presets/engines/vllm-v0.toml): per tensor an NCCL broadcast over the TP group
    (4.5 us at tp 2 over NVLink, 5.5 us at tp 4: NCCL's chain, a hop more each further rank) and 29 us of the
    receiving worker's host time (two eager dispatches, torch.empty and the broadcast, at specs/host_cost.py's
    14.5 us), after the last worker's look at the metadata queue (61 us x (tp - 1) / tp). tp 2: 9 x (4.5 + 29) +
    30.5 = 0.33 ms; tp 4: 9 x (5.5 + 29) + 45.8 = 0.36 ms; nothing at tp 1, and nothing for V1, whose workers prepare
    their own input."""
    from meshplan.collectives.price import collective_time  # noqa: PLC0415

    v0 = load_engine("vllm-v0")
    assert (v0.tp_broadcast_tensors, v0.tp_broadcast_dispatches, EAGER_OP_HOST) == (9, 2, pytest.approx(14.5e-6))
    assert load_engine("vllm-v0.5").tp_broadcast_tensors == 9 and load_engine("vllm").tp_broadcast_tensors == 0
    seen = []
    for tp in (1, 2, 4):
        s = setting("vllm-v0", "h100", tp=tp)
        nccl = float(collective_time("broadcast", 8.0 * 16, tp, 1, s.cluster, s.eff))
        expected = 0.0 if tp == 1 else 9 * (nccl + 2 * 14.5e-6) + 61e-6 * (tp - 1) / tp
        assert float(s.broadcast_time(16.0)) == pytest.approx(expected)
        bare = replace(s, engine=v0.with_(tp_broadcast_tensors=0, tp_broadcast_poll=0.0))
        assert float(s.time(16.0)) == pytest.approx(float(bare.time(16.0)) + expected)
        seen.append(expected)
    assert seen[0] == 0.0 and 0.32e-3 < seen[1] < seen[2] < 0.36e-3
    assert float(setting("vllm", "h100", tp=4).broadcast_time(16.0)) == 0.0


def test_the_iteration_waits_for_the_last_worker_to_look_at_the_input_queue():
    """vLLM V0's TP workers look at the driver's shared-memory input queue every 61 us (time.sleep(1e-7) stretched by
    Linux's 50 us timer slack: data/measured/2026-11-29-shm-poll-sleep.json), each at its own phase: the last of
    k = tp - 1 looks comes k / (k + 1) of an interval after the write. 61 x 1/2 = 30.5 us at tp 2, 61 x 3/4 = 45.75 us
    at tp 4, 61 x 7/8 = 53.375 us at tp 8; nothing at tp 1. The ROCm builds run the same queue (vLLM v0.6.1's
    shm_broadcast.py has no platform test, and parallel_state.py creates it for every TP group): the same wait."""
    v0 = load_engine("vllm-v0")
    builds = ("vllm-v0.5", "vllm-v0.5-rocm", "vllm-v0.6-rocm")
    assert all(load_engine(name).tp_broadcast_poll == v0.tp_broadcast_poll == pytest.approx(61e-6) for name in builds)
    assert load_engine("vllm").tp_broadcast_poll == 0.0
    only_poll = v0.with_(tp_broadcast_tensors=0)
    for tp, us in ((1, 0.0), (2, 30.5), (4, 45.75), (8, 53.375)):
        s = replace(setting("vllm-v0", "h100", tp=tp), engine=only_poll)
        assert float(s.broadcast_time(16.0)) == pytest.approx(us * 1e-6)
        rocm = setting("vllm-v0.6-rocm", "mi300x", tp=tp)
        bare = replace(rocm, engine=rocm.engine.with_(tp_broadcast_poll=0.0))
        assert float(rocm.broadcast_time(16.0)) - float(bare.broadcast_time(16.0)) == pytest.approx(us * 1e-6)


@pytest.mark.parametrize("system", ["h100", "gh200", "mi300x"])
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_more_tensor_parallel_workers_never_wait_less_for_the_last_look(system, batch):
    """The wait for the last worker's look grows with the workers (k / (k + 1) rises with k), and a longer interval
    between looks never makes an iteration cheaper."""
    waits, steps = [], []
    for tp in (1, 2, 4, 8):
        s = setting("vllm-v0", system, tp=tp, batch=batch)
        bare = replace(s, engine=s.engine.with_(tp_broadcast_poll=0.0))
        waits.append(float(s.broadcast_time(float(batch))) - float(bare.broadcast_time(float(batch))))
        slower = replace(s, engine=s.engine.with_(tp_broadcast_poll=2 * s.engine.tp_broadcast_poll))
        steps.append((float(bare.time(float(batch))), float(s.time(float(batch))), float(slower.time(float(batch)))))
    assert waits[0] == 0.0 and all(a <= b for a, b in zip(waits, waits[1:], strict=False))
    assert all(b <= m <= f for b, m, f in steps)


def test_amds_images_skinny_decode_gemms_are_priced_as_the_weight_stream():
    """AMD's rocm/vllm images (the ROCm fork) ran an fp16 GEMM of at most 4 rows on their own skinny kernel, wvSpltK
    (ROCm/vllm#56, tuned_gemm.py: n <= 4, k % 8 == 0, float16), which reads the weights once; engine_versions.toml
    prices those images with the CUDA V0 preset at the modelled rate, whose roofline already makes such a GEMM the
    weight stream, so no switch is needed there. Llama 2 7B's down projection (11,008 -> 4,096) on MI300X: its bytes
    are the weights once, 11,008 x 4,096 x 2 = 90,177,536, plus rows x (11,008 + 4,096) x 2 of activations; they
    stream at 5.3 TB/s x 0.85 x 0.803 / 0.958 (roofline.stream_bandwidth) = 3.78 TB/s: 23.9 us at 1 row. Beyond the
    kernels' fixed time (roofline.overhead: t0 = 3.1 us, and 3.9 us for the split-K reduction kernel the 64 output
    tiles of this shape call for on 304 CUs) the time is within 5 % of that stream (a 16-row tile's math at the tuned
    rate is under a tenth of it) and flat from 1 to 16 rows. (The wvSpltK kernel splits k inside its workgroups, so
    it runs no separate reduction kernel: the model's 3.9 us for one is left as it is, no fp16 run of AMD's images
    at batch 1-4 being in the data to measure it.) Upstream's v0.6.1 build, Argonne's (LLM-Inference-Bench
    vLLM/MI300X/README.md: vllm-project/vllm v0.6.1, Dockerfile.rocm), has no skinny kernels (they came upstream with
    vllm-project/vllm#15830, 2025): its untuned rate prices the same GEMM slower. More HBM bandwidth never slows
    either."""
    place = layouts(1, 1, 1)
    for engine in ("vllm-v0", "vllm-v0.6-rocm"):
        s = setting(engine, "mi300x")
        acc = s.cluster.accelerator
        at, fixed = {}, {}
        for rows in (1.0, 4.0, 16.0):
            op = gemm("mlp/down", rows, 4096, 11008, 2, 2)
            assert op.nbytes == pytest.approx(11008 * 4096 * 2 + rows * (11008 + 4096) * 2)
            at[rows] = shaped_seconds(op, s.cluster, FP16, SERVE_DEFAULT, place, s.shape(rows, 0.0, 0.0, 0.0))
            fixed[rows] = overhead(op, acc, SERVE_DEFAULT)
            faster = replace(s.cluster, accelerator=replace(acc, hbm_bandwidth=1.5 * acc.hbm_bandwidth))
            assert shaped_seconds(op, faster, FP16, SERVE_DEFAULT, place, s.shape(rows, 0.0, 0.0, 0.0)) <= at[rows]
        stream = (11008 * 4096 * 2 + 15104 * 2) / (5.3e12 * 0.85 * 0.803 / (4599 / 4800))
        assert stream == pytest.approx(23.9e-6, rel=2e-3)
        if engine == "vllm-v0":
            assert fixed[1.0] == pytest.approx(3.1e-6 + 3.9e-6)
            assert stream <= at[1.0] - fixed[1.0] <= 1.05 * stream
            assert at[16.0] <= 1.01 * at[1.0]
        else:  # the untuned library: slower than the stream at every decode batch
            assert at[1.0] > 1.5 * stream
