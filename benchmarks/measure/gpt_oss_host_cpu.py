"""The host's work per GPT-OSS layer as Megatron-Core runs it, measured on this CPU (issue 79: GPT-OSS-120B's
Megatron-Bridge runs are priced 20-100 % too fast; Megatron-Bridge PR #2960, docs/training/cuda-graphs.md @ 2f3ecca48,
measured TE-scoped CUDA graphs on attention, router and MoE preprocessing cutting GPT-OSS-20B's step 16-24 %).

benchmarks/measure/megatron_host_cpu.py's method: layers run forward and backward on CPU tensors so small (width 64,
16 tokens) that each aten op is its dispatch and the Python around it, the CPU analogue of a host-bound GPU step;
per layer the issuing thread's CPU time (``ms_per_layer``, ``time.thread_time`` as torch_release_host_cpu.py takes
it: on a shared machine what other processes take is not counted; the wall clock beside it; median of ``--repeats``
passes, the median of ``--rounds`` interleaved rounds, each code in its own process), the Python function calls
(``sys.setprofile``) and the aten ops (a TorchDispatchMode, by name).

Codes (Megatron-Core 0.17.0, .venv/framework-parsers/megatron-lm; the local, non-Transformer-Engine spec, as TE does
not run on a CPU):
- ``dense``: megatron_host_cpu.py's Megatron-Core layer (LayerNorm, biased GeLU MLP, fusions off): today's reference
  on the same loaded machine, so the GPT-OSS layer reads as a ratio to it.
- ``oss-E``: a GPT-OSS-shaped layer (megatron.bridge GPTOSSProvider's fields, megatron-bridge 0.3.1): RMSNorm, GQA
  attention with biased QKV / proj, learnable softmax offset (the sinks) with the 128-token window on every other
  layer (``window_attn_skip_freq`` 2), unfused YaRN RoPE (``apply_rope_fusion`` off, rotary base 150,000, factor 32),
  a top-4 softmax router without load-balancing loss, the alltoall token dispatcher (EP 1: its permute and unpermute,
  the tokens-per-expert ``.tolist()``), ``E`` experts on SequentialMLP (the local spec's only expert path: one biased
  GLU MLP per expert) with the clamped quick-GeGLU (``activation_func_clamp_value`` 7, ``glu_linear_offset`` 1),
  fusions off (``bias_activation_fusion`` takes TE's grouped path on a GPU).
- ``attn-4`` / ``moe-E``: the GPT-OSS layer's two halves alone (each with its norm and residual add).
Two expert counts give SequentialMLP's cost per expert, which Bridge's TEGroupedMLP does not pay (one grouped GEMM per
record); the layer less ``E`` experts' share is what a grouped run's Python around its kernels is.

On a CPU (``_cpu_cuda``): ``torch.cuda.current_device`` answers "cpu" (the softmax offset is allocated on it), the
dispatcher's device-to-host side stream is a stand-in that does nothing, the sliding window's mask is built with
the same three ops on the CPU, the row-parallel layers' reduction at tp 1 returns a clone (one aten op; Megatron's
returns its input as is, which SequentialMLP's biased fc2 then adds to in place, an autograd error: at tp > 1 an
all-reduce call stands there), the CUDA RNG tracker's fork is a no-op
(dropout 0) and the global memory buffer is torch.empty (small_work_megatron._init).

    PYTHONPATH=.venv/framework-parsers/megatron-lm python benchmarks/measure/gpt_oss_host_cpu.py \\
        --out data/measured/2026-11-30-gpt-oss-host-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from megatron_host_cpu import host_work

HERE = Path(__file__).resolve().parent
WIDTH, HEADS, GROUPS, TOKENS, LAYERS, TOPK = 64, 4, 2, 16, 4, 4
CODES = ("dense", "oss-4", "oss-16", "attn-4", "moe-4", "moe-16")
NUMBERS = ("python_calls", "aten_ops", "ms_per_layer", "wall_ms_per_layer")


def _layers(torch, code: str):
    """``LAYERS`` layers of ``code``, the shape of their input and the call that runs one."""
    sys.path.insert(0, str(HERE))
    from small_work_megatron import _init

    _cpu_cuda(torch)
    _init(torch, "cpu")
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    if code == "dense":
        config = TransformerConfig(
            num_layers=LAYERS, hidden_size=WIDTH, num_attention_heads=2, ffn_hidden_size=4 * WIDTH,
            hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=True, gated_linear_unit=False,
            activation_func=F.gelu, normalization="LayerNorm", bias_activation_fusion=False,
            bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
            gradient_accumulation_fusion=False, use_cpu_initialization=True)
        block = TransformerBlock(config, get_gpt_layer_local_spec())
        return block.layers, None, lambda layer, h, m, r: layer(h, attention_mask=m)
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    experts = int(code.split("-")[1])
    import megatron.core.tensor_parallel.mappings as mappings

    reduce = mappings._reduce  # at tp 1 it returns its input, which the biased expert's fc2 adds to in place
    mappings._reduce = lambda x, group: x.clone() if group.size() == 1 else reduce(x, group)
    config = TransformerConfig(  # megatron.bridge.models.gpt_oss.GPTOSSProvider's fields, at a CPU's size
        num_layers=LAYERS, hidden_size=WIDTH, num_attention_heads=HEADS, num_query_groups=GROUPS,
        kv_channels=WIDTH // HEADS, ffn_hidden_size=WIDTH, moe_ffn_hidden_size=WIDTH, normalization="RMSNorm",
        gated_linear_unit=True, add_bias_linear=True, hidden_dropout=0.0, attention_dropout=0.0,
        num_moe_experts=experts, moe_router_topk=TOPK, moe_router_pre_softmax=False,
        moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none", moe_permute_fusion=False,
        moe_grouped_gemm=False, window_size=(128, 0), window_attn_skip_freq=2, softmax_type="learnable",
        activation_func=quick_gelu, glu_linear_offset=1.0, activation_func_clamp_value=7.0,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, use_cpu_initialization=True)
    block = TransformerBlock(config, get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False,
                                                              normalization="RMSNorm"))
    for layer in block.layers:
        torch.nn.init.normal_(layer.self_attention.core_attention.softmax_offset)
    yarn = YarnRotaryEmbedding(WIDTH // HEADS, rotary_base=150000, scaling_factor=32.0,
                               original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                               correction_range_round_to_int=False)
    rotary, _ = yarn(TOKENS)
    if code.startswith("attn"):  # the attention half of the layer: its norm, the attention, the residual add
        return block.layers, rotary, lambda layer, h, m, r: layer.self_attention(
            layer.input_layernorm(h), attention_mask=m, rotary_pos_emb=r)[0] + h
    if code.startswith("moe"):  # the MoE half: its norm, router, dispatch, experts, combine, the residual add
        return block.layers, rotary, lambda layer, h, m, r: layer.mlp(layer.pre_mlp_layernorm(h))[0] + h
    return block.layers, rotary, lambda layer, h, m, r: layer(h, attention_mask=m, rotary_pos_emb=r)


def _cpu_cuda(torch) -> None:
    """The CUDA calls the GPT-OSS layer makes, answered on a CPU: ``current_device`` "cpu" (the softmax offset's
    device), and the alltoall dispatcher's side stream for its device-to-host copy of the split sizes (a stream whose
    wait, record and synchronize do nothing: on a CPU the sizes are already the host's)."""
    import contextlib

    class Stream:
        def wait_stream(self, other):
            return None

        def record_event(self):
            return self

        def synchronize(self):
            return None

    main = Stream()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.Stream = Stream
    torch.cuda.current_stream = lambda *a: main
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    import megatron.core.fusions.fused_softmax as fs

    def window_mask(sq, skv, window_size):  # megatron/core/transformer/utils.py's, its ones on this device
        m = torch.ones(sq, skv, dtype=torch.bool)
        return ~torch.tril(torch.triu(m, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])

    fs.get_sliding_window_causal_mask = window_mask


def measure(code: str, repeats: int) -> dict:
    """One code's layers: Python calls, aten ops (also by name) and wall seconds per layer, forward + backward."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers, rotary, run = _layers(torch, code)
    mask = torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool).triu(1)

    def step() -> None:
        h = torch.randn(TOKENS, 1, WIDTH, requires_grad=True)
        for layer in layers:
            h = run(layer, h, mask, rotary)
            h = h[0] if isinstance(h, tuple) else h
        h.float().sum().backward()

    return host_work(step, repeats, LAYERS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the JSON file to write")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the codes, alternated")
    parser.add_argument("--repeats", type=int, default=20, help="timed passes per round")
    parser.add_argument("--child", choices=CODES, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.repeats)))
        return
    import torch

    rounds: dict[str, list[dict]] = {c: [] for c in CODES}
    for _ in range(a.rounds):
        for code in CODES:
            out = subprocess.run([sys.executable, __file__, "--child", code, "--repeats", str(a.repeats)],
                                 env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                                 check=True)
            rounds[code].append(json.loads(out.stdout.strip().splitlines()[-1]))
    median = {c: {k: statistics.median(r[k] for r in rounds[c]) for k in NUMBERS} for c in CODES}
    lo, hi = (int(c.split("-")[1]) for c in CODES[1:3])
    per_expert = {k: (median["moe-16"][k] - median["moe-4"][k]) / (hi - lo) for k in NUMBERS}
    # the layer and its MoE half less their experts' loop (SequentialMLP's, which a grouped GEMM does not run)
    grouped = {k: median["oss-4"][k] - lo * per_expert[k] for k in NUMBERS}
    router = {k: median["moe-4"][k] - lo * per_expert[k] for k in NUMBERS}
    result = {
        "what": "host work per layer (forward + backward) on CPU tensors of width 64 x 16 tokens: Megatron-Core "
                "0.17.0's local-spec dense layer and a GPT-OSS-shaped MoE layer at two expert counts",
        "made_by": "benchmarks/measure/gpt_oss_host_cpu.py",
        "date": datetime.date.today().isoformat(),
        "host": platform.processor() or platform.machine(), "cpu_model": _cpu_model(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0], "torch": torch.__version__, "python": platform.python_version(),
        "rounds": {c: [{k: r[k] for k in NUMBERS} for r in rs] for c, rs in rounds.items()},
        "median": median,
        "per_expert": per_expert,
        "oss_without_expert_loop": grouped,
        "moe_without_expert_loop": router,
        "oss_over_dense": {k: grouped[k] / median["dense"][k] for k in NUMBERS},
        "ops_by_name": {c: rounds[c][-1]["ops_by_name"] for c in CODES},
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median", "per_expert", "oss_without_expert_loop",
                                             "moe_without_expert_loop", "oss_over_dense")},
                     indent=1))


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), '' where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
