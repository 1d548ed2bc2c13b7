"""cuDNN's fused attention with and without GPT-OSS's learnable sink, measured on a GPU (issue 79: the one training band
regime still unsharp is GPT-OSS-120B's Megatron-Bridge runs beside Qwen3-30B-A3B's). Run where a GPU is lent; writes
one dated JSON file for a test to read (no GPU at test time), as attention_gpu.py does.

    python benchmarks/measure/sink_attention_gpu.py --out data/measured/gpu/<date>-<gpu>-sink-attention.json

Why: GPT-OSS-120B's 18 Megatron-Bridge runs read 26-51 % too fast on H100, B200 and GB200 alike, a GPU cost that grows
with the tokens (H100: 4.4 ms a layer and micro-batch at 4,096 tokens, 15.7 ms at 16,384; GB200 and B200: 9-12 ms at
16,384). Its attention is what no other model in those tables runs: Transformer Engine's FusedAttention with
``softmax_type="learnable"`` (a sink logit per head, transformer_engine/common/fused_attn/
fused_attn_f16_arbitrary_seqlen.cu @ v2.12: ``set_sink_token`` forward, ``set_dsink_token`` backward) at head dimension
64, on every layer, half of them with a 128-key window (``set_diagonal_band_left_bound(window_size_left + 1)``). No
published timing of the sink kernel was found (cuDNN's own GPT-OSS benchmark, cudnn-frontend benchmark/
sdpa_benchmark_training/configs/gpt_oss.py, times the window without the sink). meshplan prices the plain kernel; the
records' gap would close if the sink kernels took about 4-5x that time (forward + backward, the layer's mean of full
and windowed attention: H100 6.0 ms against 1.5 ms priced at 1 x 64 heads x 4,096 keys; GB200 11.7 against 2.6 ms at
4 x 64 heads), where meshplan already charges the plain kernel 1.6-1.9x its time on an H200 (test_attention_gpu.py).
The records say it does not (tests/test_gpt_oss_gap.py: the GB300 runs at 8,192 and 4,096 keys move a token's time as
the plain kernel's price does); this measures the kernel itself, a check that costs a minute of a lent GPU.

What: the cuDNN graph Transformer Engine builds for GPT-OSS-120B's attention (64 query heads, 8 KV heads, d = 64,
4,096 keys, SBHD strides as Megatron-Core passes them, bf16, fp32 softmax, scale 1/8, causal from the top left), per
micro-batch b (1: the H100 recipes; 4: the Blackwell ones), per mask (full causal; causal with the 128-key window),
with and without the sink (fp32, one per query head) and its gradient: the forward that keeps the statistics for
training and the backward (non-deterministic, as the recipes run it), each the median of ``reps`` CUDA-event timings
after warm-ups. FLOPs: forward 4·b·h·s·a·d with a the keys a query sees on average ((s + 1)/2 causal;
w - w(w - 1)/(2s) within a window of w keys), backward 2.5x, as meshplan counts them.

Needs cudnn-frontend's Python package, which the GPU image lacks (it has PyTorch and the cuDNN library): carry the
wheel nvidia-cudnn-frontend==1.23.0 (cp312, manylinux_2_28; 3 MB, no required dependencies; the pybind API this script
calls, whose sdpa / sdpa_backward take sink_token / dSink_token from 1.21 on) in .whl/ as gpu_session.sh's megatron
stage carries megatron-core's, install it with ``pip install --no-index --no-deps --target``, and run this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unaligned_gemm_gpu import event_median  # noqa: E402  (the same folder: its CUDA-event timer)

HEADS, KV_HEADS, HEAD_DIM, KEYS, WINDOW = 64, 8, 64, 4096, 128  # openai/gpt-oss-120b config.json
BATCHES = (1, 4)


def window_keys(s: int, w: int | None) -> float:
    """The keys a query sees on average under the causal mask, within a window of ``w`` keys (None: the whole causal
    prefix): the first w queries see 1..w, the rest w each."""
    if w is None or w >= s:
        return (s + 1) / 2
    return (w * (w + 1) / 2 + (s - w) * w) / s


def flops(b: int, s: int, w: int | None) -> tuple[float, float]:
    """Forward and backward FLOPs of one attention call (two matmuls forward, five backward counted as 2.5x)."""
    fwd = 4.0 * b * HEADS * s * window_keys(s, w) * HEAD_DIM
    return fwd, 2.5 * fwd


def sbhd(b: int, h: int, s: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """cuDNN's (b, h, s, d) dims with the strides of an [s, b, h, d] tensor (Megatron-Core's sbhd layout)."""
    return (b, h, s, HEAD_DIM), (h * HEAD_DIM, HEAD_DIM, b * h * HEAD_DIM, 1)


def _graph(cudnn, handle):
    return cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=handle)


def _build(cudnn, graph) -> None:
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()


def measure(torch, cudnn, handle, b: int, w: int | None, sink: bool, reps: int) -> dict:
    """One row: forward (with statistics) and backward seconds of the cuDNN graphs Transformer Engine builds."""
    s = KEYS
    (qd, qs), (kd, ks) = sbhd(b, HEADS, s), sbhd(b, KV_HEADS, s)
    new = {"q": (s, b, HEADS, HEAD_DIM), "k": (s, b, KV_HEADS, HEAD_DIM), "v": (s, b, KV_HEADS, HEAD_DIM),
           "o": (s, b, HEADS, HEAD_DIM), "dO": (s, b, HEADS, HEAD_DIM), "dQ": (s, b, HEADS, HEAD_DIM),
           "dK": (s, b, KV_HEADS, HEAD_DIM), "dV": (s, b, KV_HEADS, HEAD_DIM)}
    t = {n: torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.5 for n, shape in new.items()}
    t["stats"] = torch.empty(b, HEADS, s, 1, device="cuda", dtype=torch.float32)
    t["sink"] = torch.randn(1, HEADS, 1, 1, device="cuda", dtype=torch.float32)
    t["dSink"] = torch.zeros(1, HEADS, 1, 1, device="cuda", dtype=torch.float32)
    band = {"diagonal_band_right_bound": 0, "diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT}
    if w is not None:
        band["diagonal_band_left_bound"] = w

    def tensors(graph, names):
        dims = {"q": (qd, qs), "o": (qd, qs), "dO": (qd, qs), "k": (kd, ks), "v": (kd, ks)}
        return {n: graph.tensor(name=n, dim=dims[n][0], stride=dims[n][1], data_type=cudnn.data_type.BFLOAT16)
                for n in names}

    def sink_tensor(graph, name):
        return graph.tensor(name=name, dim=(1, HEADS, 1, 1), stride=(HEADS, 1, 1, 1), data_type=cudnn.data_type.FLOAT)

    fg = _graph(cudnn, handle)
    fin = tensors(fg, ("q", "k", "v"))
    fsink = sink_tensor(fg, "sink") if sink else None
    o, stats = fg.sdpa(name="sdpa", q=fin["q"], k=fin["k"], v=fin["v"], generate_stats=True,
                       attn_scale=HEAD_DIM ** -0.5, sink_token=fsink, **band)
    o.set_output(True).set_dim(qd).set_stride(qs)
    stats.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    _build(cudnn, fg)
    fpack = {fin["q"]: t["q"], fin["k"]: t["k"], fin["v"]: t["v"], o: t["o"], stats: t["stats"]}
    if sink:
        fpack[fsink] = t["sink"]
    fws = torch.empty(fg.get_workspace_size(), device="cuda", dtype=torch.uint8)

    bg = _graph(cudnn, handle)
    bin_ = tensors(bg, ("q", "k", "v", "o", "dO"))
    bstats = bg.tensor(name="stats", dim=tuple(t["stats"].shape), stride=tuple(t["stats"].stride()),
                       data_type=cudnn.data_type.FLOAT)
    bsink, dsink = (sink_tensor(bg, "sink"), sink_tensor(bg, "dSink")) if sink else (None, None)
    dq, dk, dv = bg.sdpa_backward(name="sdpa_bwd", q=bin_["q"], k=bin_["k"], v=bin_["v"], o=bin_["o"],
                                  dO=bin_["dO"], stats=bstats, attn_scale=HEAD_DIM ** -0.5, sink_token=bsink,
                                  dSink_token=dsink, **band)
    for grad, (dim, stride) in ((dq, (qd, qs)), (dk, (kd, ks)), (dv, (kd, ks))):
        grad.set_output(True).set_dim(dim).set_stride(stride)
    _build(cudnn, bg)
    bpack = {bin_[n]: t[n] for n in ("q", "k", "v", "o", "dO")} | {bstats: t["stats"], dq: t["dQ"], dk: t["dK"],
                                                                     dv: t["dV"]}
    if sink:
        bpack |= {bsink: t["sink"], dsink: t["dSink"]}
    bws = torch.empty(bg.get_workspace_size(), device="cuda", dtype=torch.uint8)

    fwd_s = event_median(torch, lambda: fg.execute(fpack, fws, handle=handle), reps, warmups=3)
    bwd_s = event_median(torch, lambda: bg.execute(bpack, bws, handle=handle), reps, warmups=3)
    fwd_f, bwd_f = flops(b, s, w)
    return {"batch": b, "heads": HEADS, "kv_heads": KV_HEADS, "d": HEAD_DIM, "keys": s, "window": w, "sink": sink,
            "fwd_s": fwd_s, "bwd_s": bwd_s, "fwd_flops": fwd_f, "bwd_flops": bwd_f,
            "fwd_tflops": fwd_f / fwd_s / 1e12, "bwd_tflops": bwd_f / bwd_s / 1e12}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    import cudnn
    import torch

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    out = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn_backend": cudnn.backend_version(), "cudnn_frontend": getattr(cudnn, "__version__", "")},
           "method": __doc__.split("\n\n")[3].strip(), "rows": []}
    for b in BATCHES:
        for w in (None, WINDOW):
            for sink in (False, True):
                try:
                    row = measure(torch, cudnn, handle, b, w, sink, args.reps)
                except Exception as err:  # noqa: BLE001  (a graph cuDNN refuses: said, not skipped silently)
                    row = {"batch": b, "window": w, "sink": sink, "error": f"{type(err).__name__}: {err}"[:300]}
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
