"""cuBLASLt's weight-gradient GEMM with and without the fused bias gradient (the BGRADB epilogue), measured on a GPU at
GPT-OSS-120B's shapes (issue 79). Run where a GPU is lent; writes one dated JSON file for a test to read.

    python benchmarks/measure/bias_grad_gemm_gpu.py --out data/measured/gpu/<date>-<gpu>-bias-grad-gemm.json

Why: GPT-OSS-120B's Megatron-Bridge BF16 runs miss a GPU cost that grows with the tokens and not with the sequence
length (GB200 25.11 at 8,192 keys and 26.02-26.04.01 at 4,096 run 15,800-16,600 tokens/s a GPU alike, where meshplan
already adds the longer attention), about 0.5 us a token and layer on a GB200, 0.6-0.7 on a B200 and 1.0 on an H100.
GPT-OSS is the one model of those tables whose linear layers have biases, and Transformer Engine fuses a 16-bit
Linear's bias gradient into its weight-gradient GEMM: ``CUBLASLT_EPILOGUE_BGRADB`` (transformer_engine/common/gemm/
cublaslt_gemm.cu @ v2.12, "grad output is always input B"), for the QKV projection (LayerNormLinear) and the experts'
fc1 (GroupedLinear: module/grouped_linear.py @ v2.12, "Grad bias is fused with wgrad GEMM"), accumulating into the
fp32 main_grad; its FP8 / MXFP8 recipes take the bias gradient from a separate bgrad_quantize kernel instead. Whether
cuBLASLt's BGRADB kernels run at the plain GEMM's rate on Hopper and Blackwell is not published (on an A100, cuda 11.7,
NVIDIA/CUDALibrarySamples#90 reports a 10B model's backward 4.0 -> 6.6 s with the BGRAD epilogues on).

What: per shape, the GEMM Transformer Engine issues (column-major, m = in features, n = out features, k = tokens;
A = the input, not transposed, B = the output gradient, transposed; D = the weight gradient), bf16 inputs, fp32
compute, in two output forms (bf16 D, beta 0; fp32 D accumulated with beta 1, as into main_grad), with epilogue
DEFAULT and BGRADB (the bias gradient in bf16: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, as Transformer Engine sets it),
cuBLASLt's first heuristic as Transformer Engine takes it, the median of ``reps`` CUDA-event timings after warm-ups;
and the forward GEMM with and without the BIAS epilogue.
Shapes: fc1 (2,880 -> 2 x 2,880) at 1,024 / 4,096 / 32,768 tokens an expert (H100, B200, GB200 recipes), the QKV
projection (2,880 -> 5,120) at 4,096 and 16,384 tokens. cuBLASLt is called through ctypes (the GPU image's libcublasLt,
the one PyTorch loads), so nothing needs carrying.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unaligned_gemm_gpu import event_median  # noqa: E402  (the same folder: its CUDA-event timer)

# cublasLt.h / library_types.h / cublas_api.h enum values
CUDA_R_32F, CUDA_R_16BF, COMPUTE_32F = 0, 14, 68
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER, DESC_BIAS_DATA_TYPE = 3, 4, 7, 8, 26
PREF_MAX_WORKSPACE_BYTES = 1
EPILOGUE = {"default": 1, "bias": 4, "bgradb": 512}
OP_N, OP_T = 0, 1
WORKSPACE = 32 << 20  # TE cpp_extensions/gemm.py get_cublas_workspace_size_bytes @ v2.12: 32 MiB from Hopper on

# (name, m, n, k): wgrad D[m x n] = input[m x k] . grad[k x n] (k the tokens)
WGRAD = [("fc1", 2880, 5760, 1024), ("fc1", 2880, 5760, 4096), ("fc1", 2880, 5760, 32768),
         ("qkv", 2880, 5120, 4096), ("qkv", 2880, 5120, 16384)]
# (name, m, n, k): forward D[out x tokens] = W[out x in] . x[in x tokens]
FORWARD = [("fc1", 5760, 4096, 2880), ("fc1", 5760, 32768, 2880)]


def _lib():
    names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]
    import torch

    roots = [os.path.dirname(torch.__file__), *sys.path]
    names += [p for r in roots for p in glob.glob(os.path.join(r, "nvidia", "**", "libcublasLt.so*"), recursive=True)]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcublasLt not found")


class Lt:
    """The few cuBLASLt calls a GEMM needs, through ctypes."""

    def __init__(self, torch):
        self.torch, self.lib = torch, _lib()
        self.handle = ctypes.c_void_p()
        self._ok(self.lib.cublasLtCreate(ctypes.byref(self.handle)))
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")

    @staticmethod
    def _ok(status: int) -> None:
        if status != 0:
            raise RuntimeError(f"cuBLASLt status {status}")

    def _attr(self, fn, obj, attr: int, value, ctype) -> None:
        v = ctype(value)
        self._ok(fn(obj, attr, ctypes.byref(v), ctypes.sizeof(v)))

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        self._ok(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, ctypes.c_uint64(rows),
                                                     ctypes.c_uint64(cols), ctypes.c_int64(ld)))
        return layout

    def gemm(self, m: int, n: int, k: int, trans_b: bool, epilogue: str, d_fp32: bool, reps: int) -> float:
        """Median seconds of D[m x n] = A[m x k] . op(B) (+ epilogue), A and B bf16."""
        t = self.torch
        a = t.randn(k, m, dtype=t.bfloat16, device="cuda")  # column-major m x k, ld m
        b = t.randn((k, n) if trans_b else (n, k), dtype=t.bfloat16, device="cuda")  # op(B) = k x n
        d = t.zeros(n, m, dtype=t.float32 if d_fp32 else t.bfloat16, device="cuda")
        bias = t.zeros(m if epilogue == "bias" else n, dtype=t.bfloat16, device="cuda")  # TE's bias_type: bf16
        desc = ctypes.c_void_p()
        self._ok(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, CUDA_R_32F))
        set_desc = self.lib.cublasLtMatmulDescSetAttribute
        self._attr(set_desc, desc, DESC_TRANSA, OP_N, ctypes.c_int32)
        self._attr(set_desc, desc, DESC_TRANSB, OP_T if trans_b else OP_N, ctypes.c_int32)
        self._attr(set_desc, desc, DESC_EPILOGUE, EPILOGUE[epilogue], ctypes.c_uint32)
        if epilogue != "default":
            self._attr(set_desc, desc, DESC_BIAS_POINTER, bias.data_ptr(), ctypes.c_uint64)
            self._attr(set_desc, desc, DESC_BIAS_DATA_TYPE, CUDA_R_16BF, ctypes.c_int32)
        a_l = self._layout(CUDA_R_16BF, m, k, m)
        b_l = self._layout(CUDA_R_16BF, n, k, n) if trans_b else self._layout(CUDA_R_16BF, k, n, k)
        d_l = self._layout(CUDA_R_32F if d_fp32 else CUDA_R_16BF, m, n, m)
        pref = ctypes.c_void_p()
        self._ok(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)))
        self._attr(self.lib.cublasLtMatmulPreferenceSetAttribute, pref, PREF_MAX_WORKSPACE_BYTES, WORKSPACE,
                   ctypes.c_uint64)
        result, count = (ctypes.c_byte * 96)(), ctypes.c_int(0)  # cublasLtMatmulHeuristicResult_t
        self._ok(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a_l, b_l, d_l, d_l, pref, 1, result,
                                                          ctypes.byref(count)))
        if count.value < 1:
            raise RuntimeError("no cuBLASLt algorithm")
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if d_fp32 else 0.0)
        stream = ctypes.c_void_p(t.cuda.current_stream().cuda_stream)

        def run():
            self._ok(self.lib.cublasLtMatmul(self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(a.data_ptr()),
                                             a_l, ctypes.c_void_p(b.data_ptr()), b_l, ctypes.byref(beta),
                                             ctypes.c_void_p(d.data_ptr()), d_l, ctypes.c_void_p(d.data_ptr()), d_l,
                                             result, ctypes.c_void_p(self.workspace.data_ptr()),
                                             ctypes.c_size_t(WORKSPACE), stream))

        return event_median(t, run, reps, warmups=3)


def rows(lt: Lt, reps: int) -> list[dict]:
    out = []
    cases = [("wgrad", s, True, d32, e) for s in WGRAD for d32 in (False, True) for e in ("default", "bgradb")]
    cases += [("forward", s, False, False, e) for s in FORWARD for e in ("default", "bias")]
    for kind, (name, m, n, k), trans_b, d32, epilogue in cases:
        row = {"kind": kind, "name": name, "m": m, "n": n, "k": k, "d_fp32": d32, "epilogue": epilogue}
        try:
            seconds = lt.gemm(m, n, k, trans_b, epilogue, d32, reps)
            row |= {"seconds": seconds, "tflops": 2.0 * m * n * k / seconds / 1e12}
        except (RuntimeError, OSError) as err:  # a combination cuBLASLt refuses: said, not skipped silently
            row["error"] = str(err)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    lt = Lt(torch)
    out = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cublaslt": int(lt.lib.cublasLtGetVersion())},
           "method": __doc__.split("\n\n")[3].strip(), "rows": rows(lt, args.reps)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
