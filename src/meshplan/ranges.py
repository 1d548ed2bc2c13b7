"""The physical range of every numeric field and option, stated once, checked where the value is read.

Every number meshplan reads (a spec field of ``Accelerator``, ``Tier``, ``Cluster``, ``Network``, ``ModelSpec`` or
``Plan``, a command-line option) has a range here: generous enough for every preset, every Hugging Face config and
every published run meshplan validates (``tests/test_ranges.py`` checks them), tight enough that no combination of
in-range values makes a NaN, an infinity or an overflow (the search ranks plans in float32: every time and byte
count stays far below 3.4e38, ``tests/test_ranges.py`` prices the corners). A value outside its range is one line
naming the field, the value and the range: ``nic_latency=1.7e+308 s is outside 0 … 1 s``.

Two products are bounded besides the fields: a model's parameters (``MAX_PARAMS``) and the tokens of one step
(``MAX_STEP_TOKENS``), which with the slowest hardware in range keep every time below 1e35 s:
6 · 1e15 parameters · 2^40 tokens / 1 FLOP/s (the slowest GEMM rate in range) ≈ 7e27 s.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, NamedTuple

from meshplan.errors import SpecError
from meshplan.fields import MAX_GPUS, MAX_LAYERS, MAX_SIZE


class Range(NamedTuple):
    """``low`` … ``high`` in ``unit``; ``zero``: what 0 means where 0 is also allowed ("" where it is not)."""

    low: float
    high: float
    unit: str
    why: str
    zero: str = ""


_WIDTH = 2**20  # 1,048,576: 40x the widest hidden size trained (Megatron-LM's 1T model, 25,600)
_FFN = 2**22  # 4,194,304: 40x the widest FFN trained (GPT-3 175B / Megatron-LM 1T, 102,400)
_HEADS = 2**16  # 65,536: 400x the most attention heads trained (Megatron-LM 1T, 160)
_LORA = 2**16  # 65,536: LoRA ranks in use are 4-256 (Hu et al. 2021 use 1-64; QLoRA 64)
# A model's parameters: 10^15, 500x the largest models trained (~2T); with MAX_STEP_TOKENS it bounds every FLOP count
MAX_PARAMS = 10**15
# Tokens of one step (global batch x sequence): 2^40 = 1.1e12, 65,000x Llama 3 405B's 16M-token batches
MAX_STEP_TOKENS = 2**40
_POWER = "0.1 kW class parts (L4 72 W) to 1.4 kW (B300); 100 kW is 4x a Cerebras CS-3 system (23 kW)"
_LATENCY = "NCCL's per-step latencies are 0.5-10 us (src/graph/tuning.cc hwLat); a second is 10^5 times that"

RANGES: dict[str, Range] = {
    # ---- Accelerator ------------------------------------------------------------------------------------------
    "peak_flops": Range(1e6, 1e18, "FLOP/s", "dense peak per precision: presets 15.7 TFLOP/s (V100 fp32) to 15 "
                        "PFLOP/s (B300 fp4); 1 EFLOP/s is 66x that; calibrate on a CPU measures >= 1 GFLOP/s"),
    "hbm_bytes": Range(1e6, 1e15, "B", "1 MB ... 1 PB: presets 32 GiB (V100) to 288 GB (B300); a CPU "
                       "calibration reports host memory (a few TB at most)"),
    "hbm_bandwidth": Range(1e6, 1e17, "B/s", "presets 0.86-8 TB/s (HBM3e); 100 PB/s is 5x Cerebras WSE-3's "
                           "21 PB/s on-chip SRAM, the fastest memory of any chip"),
    "nvlink_bandwidth": Range(1e6, 1e16, "B/s", "per GPU per direction: presets 32 GB/s (PCIe) to 900 GB/s "
                              "(NVLink 5); 10 PB/s is 10,000x NVLink 5"),
    "num_sms": Range(1, 1_000_000, "", "GPUs have 20-304 SMs / CUs; Cerebras WSE-3 has 900,000 cores"),
    "tdp_watts": Range(1, 100_000, "W", _POWER, "unknown"),
    "idle_watts": Range(1, 100_000, "W", _POWER, "unknown"),
    "matmul_bf16": Range(1e-9, 1, "", "MAMF / dense peak: measured 0.51-0.87 (ml-engineering's table), at most 1 "
                         "by definition; a CPU calibrated against a GPU's peak reads ~1e-6", "looked up"),
    "matmul_fp8": Range(0.01, 1, "", "as matmul_bf16, for fp8 (and fp4) GEMMs", "looked up"),
    "hbm_copy_share": Range(0, 1, "", "a large copy's measured bandwidth over the datasheet HBM figure: 0.80 on "
                            "MI300X (BabelStream Copy), 0.96 on H200; a copy never beats the datasheet",
                            "not measured"),
    "matmul_watts": Range(1, 100_000, "W", _POWER, "unknown"),
    "gemm_overhead": Range(0, 1, "s", "fixed time per tensor-core kernel (calibrate's GEMM fit intercept): "
                           "2-20 us on GPUs; calibrate writes one only below 1 ms and its fastest GEMM; a second is "
                           "10^5 x that"),
    "kernel_overhead": Range(0, 1, "s", "fixed time per other kernel (calibrate's memory fit intercept): 2-10 us "
                             "on GPUs, more on a CPU; a second is 10^5 x that"),
    "attention_flops": Range(1e6, 1e18, "FLOP/s", "measured causal attention forward rate (calibrate): "
                             "FlashAttention-3 reaches 0.74 PFLOP/s on H100, a CPU a few GFLOP/s; 1 EFLOP/s is past "
                             "any peak_flops",
                             "not measured"),
    "attention_overhead": Range(0, 1, "s", "fixed time per attention kernel (calibrate's attention fit intercept): "
                                "microseconds on GPUs, up to milliseconds on a CPU; a second is 10^5 x that"),
    "allreduce_latency": Range(0, 1, "s", "a small all-reduce's fixed time inside NVLink: 5-13 us measured (A100, "
                               "H100); a second is 10^5 x that", "not measured"),
    "allreduce_bandwidth": Range(1e6, 1e16, "B/s", "a small all-reduce's bus rate inside NVLink: 49-61 GB/s measured "
                                 "(one- / two-shot kernels); 10 PB/s is 10,000x NVLink 5", "not measured"),
    "allreduce_measured": Range(1, 1e15, "B", "the largest all-reduce measured for the two above: 1-2 MiB",
                                "not measured"),
    "l2_bandwidth": Range(1e6, 1e17, "B/s", "L2 read bandwidth: 7.2 TB/s on A100 (5120 B/clk at 1.41 GHz); 100 PB/s "
                          "is past any on-chip cache", "unstated"),
    "l2_dies": Range(1, 64, "", "dies with a private L2 a kernel's workgroups are dealt over: 1, MI300X 8 (XCDs); "
                     "64 is past any package built"),
    "exp_rate": Range(0.1, 10, "", "exponential (MUFU.EX2) rate per SM clock relative to Hopper: 1, Blackwell "
                      "Ultra 2; a tenth or ten times that is past any GPU built"),
    "cuda_context": Range(0, 1e12, "B", "the CUDA context with its kernels: 1.3-1.6 GiB measured (V100, A100, "
                          "eager loading), a few hundred MiB lazily; 1 TB is past any GPU's memory"),
    "nccl_pair": Range(0, 1e12, "B", "NCCL's buffers a two-rank communicator holds: 544 MB on A100s "
                       "(NVIDIA/nccl#964); 1 TB is past any GPU's memory"),
    "nccl_group": Range(0, 1e12, "B", "NCCL's buffers a larger communicator holds: 688 MB on A100s "
                        "(NVIDIA/nccl#964); 1 TB is past any GPU's memory"),
    # ---- Network / Tier / Cluster -----------------------------------------------------------------------------
    "nvlink_domain": Range(1, MAX_GPUS, "", "GPUs per scale-up domain: 4-72 built (NVL72), 576 announced; up to "
                           "the largest cluster meshplan plans (what if every GPU were on NVLink?)"),
    "nvlink_latency": Range(0, 1, "s", _LATENCY),
    "nics_per_gpu": Range(0.001, 64, "", "0.5 (DGX-2) to 1 in the presets; one NIC per 1,000 GPUs or 64 per GPU "
                          "is past any machine built"),
    "nic_bandwidth": Range(1e6, 1e15, "B/s", "per NIC per direction: 10 Mb/s Ethernet is 1.25 MB/s, ConnectX-8 "
                           "800 Gb/s is 100 GB/s; 1 PB/s is 10,000x that"),
    "nic_latency": Range(0, 1, "s", _LATENCY),
    "host_bandwidth": Range(1e6, 1e15, "B/s", "GPU to host per direction: PCIe Gen3 x16 14 GB/s to NVLink-C2C 450 "
                            "GB/s (GH200)"),
    "python_host": Range(0.1, 100, "", "host CPU time for PyTorch's Python-side work against an x86 DGX host: 1, "
                         "Grace 2.5-2.8 (TransformerEngine issue #2053); 100x is past any server CPU"),
    "interpreter_host": Range(0.1, 100, "", "host CPU time for interpreter-bound Python against an x86 DGX host: 1, "
                              "Grace 1.15 (dgxc-benchmarking cpu_overhead); 100x is past any server CPU",
                              "python_host"),
    "host_memory": Range(1e6, 1e15, "B", "host memory per GPU for offload: presets 64-256 GB; 1 PB is 4,000x"),
    "size": Range(1, MAX_GPUS, "", "Tier: GPUs per group of a mesh dimension, at most the cluster",
                  "the rest (a system file's outermost tier)"),
    "bandwidth": Range(1e3, 1e17, "B/s", "Tier: per GPU per direction: nvlink_bandwidth, or nics_per_gpu x "
                       "nic_bandwidth (0.001 x 1 MB/s ... 64 x 1 PB/s)", "the accelerator's nvlink_bandwidth (tier 0 "
                       "of a system file)"),
    "latency": Range(0, 1, "s", "Tier: " + _LATENCY),
    "oversubscription": Range(1, 1000, "", "a tier's k:1 switch taper: 1 in non-blocking fat trees (DGX SuperPOD), 7 "
                              "at the aggregation layer of Meta's Llama 3 clusters; 1000:1 is past any fabric built"),
    "peers": Range(0, 1023, "", "Tier: GPUs each GPU links to directly on a switchless tier: 7 on an MI300X board, 4 "
                   "on a DGX-1 (0: a switch); 1023 is past any direct-connect board", "0 (a switch)"),
    "nvlink_peers": Range(0, 1023, "", "tier 0's direct links per GPU without a switch: 7 on an MI300X board, 4 on a "
                          "DGX-1 (0: NVSwitch); 1023 is past any direct-connect board", "0 (NVSwitch)"),
    "num_gpus": Range(1, MAX_GPUS, "", "2^20: beyond every machine built or announced (a few hundred thousand "
                      "to a million GPUs)"),
    # ---- ModelSpec ----------------------------------------------------------------------------------------------
    "num_layers": Range(1, MAX_LAYERS, "", "10x the deepest transformer trained (DeepNet: 1,000 layers)"),
    "hidden_size": Range(1, _WIDTH, "", "40x the widest trained (Megatron-LM 1T: 25,600)"),
    "num_heads": Range(1, _HEADS, "", "400x the most heads trained (Megatron-LM 1T: 160)"),
    "ffn_hidden_size": Range(1, _FFN, "", "40x the widest FFN trained (102,400)"),
    "vocab_size": Range(1, 2**24, "", "64x the largest vocabulary (Gemma 3: 262,144)"),
    "num_kv_heads": Range(1, _HEADS, "", "as num_heads", "as num_heads"),
    "head_dim": Range(1, _WIDTH, "", "at most the hidden size (one head); heads use 64-256", "hidden / heads"),
    "seq_length": Range(1, MAX_SIZE, "", "2^31 - 1, the int32 index bound: 200x the longest context trained "
                        "(10M)"),
    "sliding_window": Range(1, MAX_SIZE, "", "at most a sequence (Mistral 4,096, GPT-OSS 128)", "none"),
    "window_layers": Range(1, MAX_LAYERS, "", "at most the layers", "every attention layer"),
    "max_position_embeddings": Range(1, MAX_SIZE, "", "as seq_length", "the sequence length"),
    "num_experts": Range(1, _WIDTH, "", "DeepSeek-V3 256, Qwen3 512; 1,048,576 is PEER's (He 2024) million "
                         "experts", "a dense model"),
    "moe_topk": Range(1, _WIDTH, "", "at most the experts (2-22 in use)", "a dense model"),
    "moe_ffn_hidden_size": Range(1, _FFN, "", "as ffn_hidden_size", "ffn_hidden_size"),
    "shared_expert_ffn_size": Range(1, _FFN, "", "as ffn_hidden_size", "none"),
    "first_k_dense_layers": Range(1, MAX_LAYERS, "", "at most the layers", "none"),
    "moe_layer_freq": Range(1, MAX_LAYERS, "", "at most the layers"),
    "rope_theta": Range(1.0, 1e12, "", "RoPE bases in use are 1e4-5e7 (GPT-NeoX 1e4, Llama 3 5e5, Qwen3 1e6)",
                        "not stated"),
    "glu_clamp": Range(1e-3, 3.4e38, "", "a clamp on bf16 activations (GPT-OSS 7): beyond bf16's largest value "
                       "(3.39e38) it never acts", "no clamp"),
    "q_lora_rank": Range(1, _WIDTH, "", "at most the hidden size (DeepSeek-V3 1,536)", "no q compression"),
    "kv_lora_rank": Range(1, _WIDTH, "", "at most the hidden size (DeepSeek-V3 512)", "standard attention"),
    "qk_nope_head_dim": Range(1, _HEADS, "", "MLA head widths (DeepSeek-V3 128)", "not MLA"),
    "qk_rope_head_dim": Range(1, _HEADS, "", "MLA head widths (DeepSeek-V3 64)", "not MLA"),
    "v_head_dim": Range(1, _HEADS, "", "MLA head widths (DeepSeek-V3 128)", "not MLA"),
    "mamba_heads": Range(1, _HEADS, "", "Nemotron-H 64-128", "no Mamba"),
    "mamba_head_dim": Range(1, _HEADS, "", "Mamba-2 uses 64", "no Mamba"),
    "mamba_state": Range(1, _HEADS, "", "Mamba-2 uses 64-256", "no Mamba"),
    "mamba_groups": Range(1, _HEADS, "", "at most the heads (1-8 in use)"),
    "mamba_conv": Range(1, 2**16, "", "the causal conv1d kernel: 4 in every Mamba"),
    "mamba_chunk": Range(1, MAX_SIZE, "", "the SSD chunk: 128-256 in use, at most a sequence"),
    "gdn_key_heads": Range(1, _HEADS, "", "Qwen3-Next 16", "no Gated DeltaNet"),
    "gdn_key_dim": Range(1, _HEADS, "", "128 in use", "no Gated DeltaNet"),
    "gdn_value_heads": Range(1, _HEADS, "", "Qwen3-Next 32", "no Gated DeltaNet"),
    "gdn_value_dim": Range(1, _HEADS, "", "128 in use", "no Gated DeltaNet"),
    "gdn_conv": Range(1, 2**16, "", "the short causal conv1d kernel: 4 in use"),
    "gdn_chunk": Range(1, MAX_SIZE, "", "fla's chunk: 64"),
    "ssm_inner": Range(1, MAX_SIZE, "", "Mamba-1: 2·H", "no Mamba-1"),
    "ssm_dt_rank": Range(1, MAX_SIZE, "", "Mamba-1: ⌈H / 16⌉", "no Mamba-1"),
    "kda_gate_rank": Range(1, _WIDTH, "", "Kimi Linear's low-rank gates: the head width, 128", "full-rank gates"),
    "lightning_block": Range(1, MAX_SIZE, "", "MiniMax's lightning-attention block: 256"),
    "window_head_dim": Range(1, _WIDTH, "", "as head_dim (Gemma 4 unified: 256 beside 512)", "head_dim"),
    "window_kv_heads": Range(1, _HEADS, "", "as num_kv_heads", "num_kv_heads"),
    "lru_width": Range(1, MAX_SIZE, "", "RecurrentGemma: the hidden size", "no RG-LRU"),
    "lru_heads": Range(1, _HEADS, "", "RecurrentGemma: its attention heads, 10", "no RG-LRU"),
    "lru_conv": Range(1, 2**16, "", "the RG-LRU's temporal conv1d: 4"),
    "short_conv": Range(1, 2**16, "", "LFM2's short convolution: conv_L_cache 3, LFM3's 7", "no C blocks"),
    "block_norms": Range(1, 2, "", "a hybrid block's pre-norm (1), and its post-norm (2: Gemma 4)"),
    "index_heads": Range(1, _HEADS, "", "DeepSeek-V3.2's lightning indexer: 64", "no DSA indexer"),
    "index_head_dim": Range(1, _HEADS, "", "DeepSeek-V3.2: 128", "no DSA indexer"),
    "index_topk": Range(1, MAX_SIZE, "", "keys each query attends: DeepSeek-V3.2 2,048", "dense attention"),
    "moe_latent_size": Range(1, _WIDTH, "", "at most the hidden size (Nemotron 3 Super 1,024)", "no latent"),
    "mtp_layers": Range(1, MAX_LAYERS, "", "1-2 in use", "none"),
    # the extras of specs/model_extras.py
    "act_params": Range(1, 64, "", "learned scalars of one MLP's activation: xIELU's 2 (Apertus)", "none"),
    "head_vocab_size": Range(1, 2**24, "", "as vocab_size (Moshi's head: 32,000 of the embedding's 32,001)",
                             "the embedding's vocabulary"),
    "attention_experts": Range(1, _WIDTH, "", "as num_experts (JetMoE: 8 attention experts)", "none"),
    "per_layer_input": Range(1, _WIDTH, "", "a per-layer embedding's width (Gemma 4: 256)", "none"),
    "per_layer_vocab": Range(1, 2**24, "", "as vocab_size (Gemma 4: 262,144)", "none"),
    "layer_norms": Range(1, 4, "", "1 (parallel attention + MLP), 2 (pre-norms), 4 (Gemma 2 / 3's post-norms too)",
                         "no norm weights (OLMo's non-parametric LayerNorm)"),
    # ---- Plan and the options that set it -----------------------------------------------------------------------
    "dp": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "tp": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "pp": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "cp": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "tp2": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "ep": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "etp": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster", "tp"),
    "vpp": Range(1, MAX_LAYERS, "", "model chunks per pipeline rank: at most the layers"),
    "last_stage_layers": Range(1, MAX_LAYERS, "", "at most the layers", "an even split"),
    "first_stage_layers": Range(1, MAX_LAYERS, "", "at most the layers", "an even split"),
    "micro_batch": Range(1, MAX_SIZE, "", "sequences: the int32 index bound (the search enumerates divisors)"),
    "global_batch": Range(1, MAX_SIZE, "", "sequences: the int32 index bound (the search enumerates divisors)",
                          "dp x micro_batch"),
    "zero": Range(0, 3, "", "ZeRO stages 0-3 (Rajbhandari et al. 2020)"),
    "recompute_layers": Range(1, MAX_LAYERS, "", "at most the layers", "all of them"),
    "offload_layers": Range(1, MAX_LAYERS, "", "at most the layers", "all of them"),
    "servers": Range(1, MAX_GPUS, "", "parameter-server shards: at most one per GPU of the cluster", "one per GPU"),
    "distributed_optimizer_instances": Range(1, MAX_GPUS, "", "ZeRO groups the data-parallel ranks split into: at "
                                             "most one per GPU (specs/check_zero_group.py)", "one: every replica"),
    "grad_bytes": Range(2, 4, "B", "bf16 (2) or fp32 (4) gradients: the only reduce dtypes costed"),
    "lora_rank": Range(1, _LORA, "", "LoRA ranks in use are 4-256; 65,536 is above every hidden size trained",
                       "full training (the --lora-rank option)"),
    "train_metrics": Range(1, 100, "", "cross-entropies evaluated per micro-batch for metrics (Composer's MPT: 2)",
                           "none"),
    "vocab_multiple": Range(1, 2**16, "", "rows per rank the output layer's vocabulary is padded to a multiple of: "
                            "Megatron-LM's 128; 65,536 is past any vocabulary shard"),
    "host_dispatch": Range(0, 0.01, "s", "host seconds per launched kernel: 3 us raw cuLaunchKernel to ~100 us (a "
                           "te.Linear on Grace, TransformerEngine #2053); 10 ms is 100x that", "the host never limits"),
    "collective_host": Range(0, 0.01, "s", "host seconds per collective call: ~15 us (an eager op's dispatch, "
                             "specs/stack.py); 10 ms is 700x that", "a kernel's host_dispatch"),
    "region_host": Range(0, 0.1, "s", "host seconds per torch.compile region and pass: 0.29 ms measured (a GPT layer "
                         "on an H200 host, specs/stack.py); 100 ms is 300x that", "no compiled region"),
    "expert_tensors": Range(1, 16, "", "stacked expert tensors a layer: 2-3 in the frameworks that stack them",
                            "an fc1 and an fc2 per local expert"),
    "dglu_slowdown": Range(1, 100, "", "times the grouped MLP's backward GLU kernel takes: 10 in one release "
                           "(cudnn-frontend#256); 100 is 10x that"),
    "tensor_host": Range(0, 0.001, "s", "host seconds per parameter tensor per optimizer step: 0-220 us (up to 15 "
                         "eager ops and Python loop passes per tensor, specs/stack.py); 1 ms is 4x that", "none"),
    "tensor_host_queued": Range(0, 0.001, "s", "the part of tensor_host issued before the step's first "
                                "synchronisation: 15 us of Megatron's fp16 wrapper (specs/stack.py); at most "
                                "tensor_host", "all after it"),
    "microbatch_host": Range(0, 0.1, "s", "host seconds per micro-batch and pipeline rank outside the model: ~2 ms "
                             "with Megatron-LM's CI timers (specs/stack.py); 100 ms is 50x that", "none counted"),
    "schedule_batch": Range(1, MAX_SIZE, "", "sequences per rank in one run of the pipeline schedule: at most the "
                            "global batch (the int32 index bound)", "the step's batch in one run"),
    "iteration_host": Range(0, 1.0, "s", "host seconds per training step outside the optimizer: a few ms of logging "
                            "(specs/stack.py); 1 s is 100x that", "none counted"),
    "summa_panels": Range(1, _WIDTH, "", "at most the hidden size", "max(tp, tp2)"),
    "moe_expert_capacity_factor": Range(0.01, 1024, "", "Megatron-Bridge's 25.09 recipes: 1.0, GShard / Switch "
                                        "1.0-2.0; past experts / topk nothing is dropped (1,024: every expert count "
                                        "trained)"),
    # ---- serving (serve/): ServePlan, Workload, Engine --------------------------------------------------------------
    "dpa": Range(1, MAX_GPUS, "", "a parallel axis is at most the cluster"),
    "batch": Range(1, MAX_SIZE, "", "sequences in flight per instance: the int32 index bound"),
    "replicas": Range(1, MAX_GPUS, "", "instances: at most the cluster's GPUs"),
    "prefill_replicas": Range(1, MAX_GPUS, "", "prefill instances: at most the cluster's GPUs", "co-located"),
    "input_len": Range(1, 2**27, "", "prompt tokens: 128M, 10x the longest context served (10M)"),
    "output_len": Range(1, 2**27, "", "generated tokens: as input_len"),
    "cached_len": Range(0, 2**27 - 1, "", "prompt tokens found in the prefix cache: fewer than input_len", "none"),
    "block_size": Range(1, 2**20, "", "tokens per KV-cache page: 1 (SGLang) to 64 in use"),
    "memory_utilization": Range(0.01, 1, "", "a share of the GPU's memory (vLLM's default 0.9)"),
    "workspace": Range(0, 1e15, "B", "CUDA graphs, context and library workspaces: under a few GiB in practice"),
    "max_batched_tokens": Range(1, MAX_SIZE, "", "tokens per iteration: 2,048-16,384 in use"),
    "max_seqs": Range(1, MAX_SIZE, "", "running sequences per instance: 256-2,048 in use"),
    "iteration_overhead": Range(0, 1, "s", "host time per iteration: tens of microseconds to milliseconds"),
    "sequence_overhead": Range(0, 0.01, "s", "host time per running sequence per iteration: microseconds"),
    "hidden_sequence_overhead": Range(0, 0.01, "s", "host time per running sequence beside the GPU's step: "
                                      "microseconds"),
    "iteration_latency": Range(0, 1, "s", "engine time per iteration no host CPU speed sets: about a millisecond"),
    "skinny_gemm_rows": Range(0, MAX_SIZE, "", "rows up to which a GEMM runs untuned solutions: decode's, <= 256",
                              "none"),
    "skinny_gemm_rate": Range(0.001, 1, "", "an untuned GEMM's rate over the modelled one: 0.05-1; 1: as fast"),
    "kernel_gap": Range(0, 0.01, "s", "GPU idle time between two kernels of an iteration: microseconds"),
    "graph_max_batch": Range(0, MAX_SIZE, "", "the largest captured decode batch: 128-512 in use, 0 for none"),
    "eager_layer_overhead": Range(0, 0.1, "s", "host time to issue one layer's kernels eagerly: ~0.1-1 ms"),
    "eager_layer_tp_overhead": Range(0, 0.1, "s", "host time to issue one eager layer's TP all-reduces: ~30 us"),
    "decode_layer_kernels": Range(0, 1000, "", "kernels one decode layer launches (a profile's count): ~8-60"),
    "tp_broadcast_tensors": Range(0, 1000, "", "tensors the driver broadcasts to the TP workers per iteration: ~10"),
    "tp_broadcast_dispatches": Range(0, 100, "", "eager dispatches a receiving worker makes per broadcast tensor: ~2"),
    "tp_broadcast_poll": Range(0, 0.01, "s", "a waiting worker's interval between looks at the input queue: ~60 us"),
    "int8_weight_stream": Range(0.05, 1, "", "a weight-only int8 GEMM's streaming rate over the 16-bit one's: 0.5-1"),
    "int4_weight_stream": Range(0.05, 1, "", "a weight-only int4 GEMM's streaming rate over the 16-bit one's: 0.5-1"),
    "slo": Range(1e-6, 3600, "s", "a TTFT or TPOT target: a microsecond is below one kernel launch; no request is "
                 "served for an hour", "no target"),
    # ---- reinforcement learning (rl/): RLJob, RLPlan ---------------------------------------------------------------
    "prompts": Range(1, 2**24, "", "prompts per iteration: 32-8,192 in published runs (verl data.train_batch_size)"),
    "samples_per_prompt": Range(1, 4096, "", "rollouts per prompt: 1-64 in use (GRPO groups of 8-32)"),
    "mean_output": Range(1, 2**27, "", "mean response tokens: at most output_len", "every response output_len"),
    "length_spread": Range(0, 10, "", "the length distribution's spread: a uniform range ratio below 1, a log-normal "
                           "sigma 0.3-2 (10 puts nearly every response at the cap)", "the kind's default"),
    "mini_batches": Range(1, 4096, "", "optimizer steps per epoch over a batch: 1-64 in use (train batch / "
                          "ppo_mini_batch_size)"),
    "epochs": Range(1, 64, "", "passes over a batch (PPO's epochs): 1-4 in use"),
    "oversample": Range(1, 100, "", "rollout batches per trained batch (DAPO's dynamic sampling draws until the batch "
                        "is full: 1-3 in its runs)"),
    "staleness": Range(0, 1024, "", "steps the rollout runs ahead of the weights it uses: 0 (on-policy) to 8 in "
                       "published runs", "on-policy"),
    "forward_micro_batch": Range(1, MAX_SIZE, "", "sequences per log-prob micro-batch", "the trainer's micro-batch"),
    "gpu_memory_utilization": Range(0.01, 1, "", "the rollout engine's share of a GPU (vLLM's "
                                    "gpu_memory_utilization: verl's rollout default 0.5)", "chosen for the set-up"),
    "storage_bandwidth": Range(1e6, 1e13, "B/s", "per node, to the shared file system: 1-50 GB/s in practice"),
    # ---- options only ---------------------------------------------------------------------------------------------
    "top": Range(1, 1000, "", "plans listed: each is re-estimated in full (about 2 s for 1,000)"),
    "headroom": Range(0, 0.9, "", "the share of HBM a plan leaves free: 0 fills it; past 0.9 no plan is worth ranking",
                      "none"),
    "max_plans": Range(1, 10**15, "", "10^15 plans take over a year at 23M plans/s", "no limit"),
    "max_micro_batch": Range(1, MAX_SIZE, "", "as micro_batch"),
    "workers": Range(1, 4096, "", "local processes: more than any host's cores"),
    "tokens": Range(1, 1e18, "", "a token budget: 10^18 is 50,000x Llama 3's 15T"),
    "price": Range(1e-6, 1e6, "", "dollars per GPU-hour: far above any rental price (a few dollars)", "free"),
    "factors": Range(1e-6, 1e6, "", "a million-fold is a what-if far past any roadmap; beyond it, overflow"),
    "seed": Range(0, 2**64 - 1, "", "a random seed: NumPy's generators take a non-negative integer (issue 80: -1 was "
                  "an internal error), the search's sample hash 64 bits"),
}

# Fields whose values are a few choices rather than a range: the values and what they are
CHOICES: dict[str, tuple[tuple[int, ...], str]] = {
    "zero": ((0, 1, 2, 3), ""),
    "grad_bytes": ((2, 4), " (bytes per gradient: bf16 or fp32)"),
}

# Options whose names differ from the field they set
ALIASES = {"seq": "seq_length", "gpus": "num_gpus", "nvlink": "nvlink_domain"}


def _fmt(bound: float) -> str:
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def problem(name: str, value: Any, key: str | None = None) -> str | None:
    """What is wrong with ``value`` for ``name`` (RANGES[key or name], dashes read as underscores), or None. A
    value that is not a number is left to the type checks."""
    key = key or ALIASES.get(name.replace("-", "_"), name.replace("-", "_"))
    r = RANGES[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if key in CHOICES:
        allowed, what = CHOICES[key]
        if value in allowed:
            return None
        return f"{name}={_shown(value)} must be {', '.join(map(str, allowed[:-1]))} or {allowed[-1]}{what}"
    if (r.zero and value == 0) or r.low <= value <= r.high:
        return None
    unit = f" {r.unit}" if r.unit else ""
    zero = f" (or 0: {r.zero})" if r.zero else ""
    return f"{name}={_shown(value)}{unit} is outside {_fmt(r.low)} … {_fmt(r.high)}{unit}{zero}"


def check_value(name: str, value: Any, prefix: str = "", key: str | None = None) -> None:
    """Raise SpecError (``prefix`` + the problem) when ``value`` is outside the range of ``name``."""
    message = problem(name, value, key)
    if message:
        raise SpecError(prefix + message)


def check_spec(spec: Any, prefix: str = "") -> None:
    """Check every field of dataclass ``spec`` that has a range (a table of numbers: each of its values)."""
    for f in fields(spec):
        if f.name not in RANGES:
            continue
        value = getattr(spec, f.name)
        if isinstance(value, dict):
            for k, v in value.items():
                check_value(f"{f.name}.{k}", v, prefix, f.name)
        else:
            check_value(f.name, value, prefix)


def check_options(**options: Any) -> None:
    """Check command-line options (``None``: not given) against their ranges, before any work starts."""
    for name, value in options.items():
        if value is not None:
            check_value(name.replace("_", "-"), value)


def numeric_fields(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` declared as numbers (int, float, or a table of them)."""
    return [f.name for f in fields(cls) if str(f.type).removesuffix(" | None") in ("int", "float")
            or str(f.type).startswith("dict[str, float")]


def step_tokens_problem(global_batch: int, seq_length: int, field: str = "global_batch") -> str | None:
    """The tokens of one step (``field`` × seq_length) beyond MAX_STEP_TOKENS, or None."""
    tokens = global_batch * seq_length
    if tokens <= MAX_STEP_TOKENS:
        return None
    return (f"{field} × seq_length = {global_batch:,} × {seq_length:,} = {tokens:.4g} tokens per step is more than "
            f"2^40 = {MAX_STEP_TOKENS:,} (65,000x Llama 3's 16M-token batches)")
