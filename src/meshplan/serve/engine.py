"""Engine: what a serving engine does with a serving plan, apart from the plan (plan.py), as data with sources.

An engine (vLLM, TensorRT-LLM, SGLang …) pages the KV cache in blocks of ``block_size`` tokens (Kwon et al. 2023,
"Efficient Memory Management for Large Language Model Serving with PagedAttention", §4), takes a share of the GPU's
memory for weights, activations and that cache, and batches continuously: every iteration runs the running
sequences' next tokens together (iteration-level scheduling, Yu et al. 2022, "Orca", §4.2). Prompts enter either in
chunks of at most ``max_batched_tokens`` tokens per iteration beside the decoding sequences ("chunked": Agrawal et
al. 2024, "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", §4), whole beside the decoding
sequences within that budget ("whole": TensorRT-LLM's in-flight batching with context chunking off, its
microBatchScheduler; a longer prompt is refused), or as iterations of their own that stall the decoding batch
("separate").
``iteration_overhead``, and ``sequence_overhead`` per running sequence, is the host's time per iteration that the GPU
waits on (scheduling, input preparation, sampling, detokenisation: the vLLM team measured GPU execution at 38 % of Llama
3 8B's serving time on an H100 before v0.6.0's multi-step scheduling, vLLM blog "vLLM v0.6.0: 2.7x Throughput
Improvement and 5x Latency Reduction", 2024-09-05); ``hidden_sequence_overhead`` the host's work per sequence beside the
GPU's step. Measured in the engine's own code where it could run here (vLLM V0 and V1:
benchmarks/measure/vllm_v0_host_cpu.py, vllm_v1_host_cpu.py), else the one constant fitted per engine
(benchmarks/measure/fit_inference.py, on the fit half of the published runs).
Decode iterations up to ``graph_max_batch`` sequences replay captured CUDA graphs, a batch between two captured sizes
(``graph_sizes``) padded to the larger; beyond, the host issues every kernel and the step lasts at least that
(``eager_layer_overhead`` per layer). ``decode_layer_kernels`` is how many kernels a layer launches where a profile
counted them (gpt-fast's compiled layer: 14.25 on an H200 and an H100, docs/DECODE_GPU.md), each beyond the op list's
at the accelerator's fixed time per kernel. ``kv_overflow``: a static batch its KV cache cannot hold (metrics._static).

Presets: ``presets/engines/<name>.toml``, each number beside its source, a preset that ``extends`` another holding
what differs (files.derived); a record's engine string picks its preset by engine_versions.toml (engine_version.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types, not_a_preset, unknown_field
from meshplan.files import PRESETS, read_preset, read_toml
from meshplan.serve.plan import Workload
from meshplan.specs.host_cost import HostCost

if TYPE_CHECKING:
    from meshplan.serve.precision import Quant
    from meshplan.specs.hardware import Cluster


# The engine's families of variants (DESIGN.md: callers read a record, ``engine.mode(field)``, and never compare its
# name; tests/test_pipeline_registry.py checks): one record class a family, each variant's flags say what differs.
@dataclass(frozen=True, kw_only=True, slots=True)
class Prefill:
    name: str
    chunked: bool = False  # prompts in chunks beside the decodes (metrics.py, the launch flags, load/policy.py)
    mixed: bool = False  # prompts share an iteration with the decodes (metrics._chunked, load/policy.py)
    # a prompt longer than max_batched_tokens is refused, never run (TensorRT-LLM with chunked context off: its
    # maxInputLen = min(maxSequenceLen - 1, maxNumTokens) and LlmRequest::validate throws "Prompt length exceeds
    # maximum input length", check.PROMPT)
    bounded: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Reservation:
    name: str
    whole: bool = False  # a sequence holds pages for its prompt and whole output from admission (resident)


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeComm:
    name: str
    gather: bool = False  # the experts' tokens all-gathered (serve/moe.py)
    forwarded: bool = False  # DeepEP's forwarded dispatch (serve/moe.py)


@dataclass(frozen=True, kw_only=True, slots=True)
class Overflow:
    name: str
    preempts: bool = False  # the newest preempted, prefilled again on return (metrics._static)
    queues: bool = False  # admission waits for a whole footprint (load/policy.py)
    refuses: bool = False  # the batch is not run (metrics.static_runs)
    keeps: bool = False  # vLLM V0: the newest preempted with their output kept, back first (serve/preemption.py)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBasis:
    name: str
    of_total: bool = False  # memory_utilization is a share of the whole HBM, not of what is free (memory.kv_pool)


# a field -> its variants' records, the default first, in the order the engine checks them
ENGINE_CHOICES: dict[str, dict[str, Any]] = {f: {r.name: r for r in records} for f, records in (
    ("prefill", (Prefill(name="chunked", chunked=True, mixed=True), Prefill(name="separate"),
                 Prefill(name="whole", mixed=True, bounded=True))),
    ("kv_reservation", (Reservation(name="on_demand"), Reservation(name="full", whole=True))),
    ("moe_comm", (MoeComm(name="all_to_all"), MoeComm(name="all_gather", gather=True),
                  MoeComm(name="deepep", forwarded=True))),
    ("kv_overflow", (Overflow(name="recompute", preempts=True), Overflow(name="queue", queues=True),
                     Overflow(name="refuse", refuses=True),
                     Overflow(name="recompute_kept", preempts=True, keeps=True))),
    ("memory_basis", (MemoryBasis(name="total", of_total=True), MemoryBasis(name="free"))),
)}
TUNER_GRANULARITY, TUNER_THRESHOLD = 512, 128  # the batch tuner's fallback (engine.batch_table)


@dataclass(frozen=True, kw_only=True)
class Engine:
    """A serving engine's memory policy, scheduler and kernels (module docstring)."""

    name: str = field(default="generic", compare=False)
    version: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    block_size: int = 16  # tokens per KV-cache page (vLLM CacheConfig.block_size)
    # share of the GPU's memory the engine may fill: of all of it ("total", vLLM gpu_memory_utilization, SGLang
    # mem_fraction_static), or of what is free after the weights and activations, for the KV cache ("free",
    # TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction)
    memory_utilization: float = 0.9
    memory_basis: str = "total"
    # memory beyond weights, activations and KV cache: CUDA graphs, the CUDA context, NCCL and cuBLAS workspaces
    workspace: float = 0.75 * 2**30
    prefill: str = "chunked"
    max_batched_tokens: int = 8192  # tokens per iteration (the prefill chunk budget)
    max_seqs: int = 1024  # running sequences per scheduler: per attention group (vLLM max_num_seqs)
    # KV-cache pages a running sequence holds: those of the tokens it has ("on_demand": vLLM allocates a block as a
    # sequence reaches it and preempts when none is free, Kwon et al. 2023 §4.2), or its prompt and whole output from
    # admission on ("full": TensorRT-LLM's default GUARANTEED_NO_EVICT capacity scheduler admits a request only when
    # its maximum KV-cache footprint fits)
    kv_reservation: str = "on_demand"
    # a static batch whose sequences the KV cache cannot hold to their last token: "recompute" (vLLM V0 and V1,
    # SGLang: more are admitted than finish together, the newest are preempted, their pages freed and their tokens
    # prefilled again when they return), "queue" (admission waits until a sequence's whole footprint fits:
    # TensorRT-LLM's GUARANTEED_NO_EVICT, TurboMind), or "refuse" (the batch is not run). metrics._static prices the
    # first two as waves of the sequences that fit, "recompute_kept" (vLLM V0: the preempted keep their output, back
    # first) as its scheduler runs the batch (serve/preemption.py); serve_estimate refuses "refuse"
    kv_overflow: str = "recompute"
    iteration_overhead: float = 0.0  # host seconds per iteration the GPU waits on (sourced or fitted per preset)
    sequence_overhead: float = 0.0  # and per running sequence of the iteration (sourced or fitted per preset)
    # seconds per iteration of the engine's GPU work beside the forward pass, which a CPU measurement of the host loop
    # leaves out and no host CPU's speed sets: the sampler's kernels and the copies to and from the GPU, each launched
    # and waited on (metrics.Setting.gpu_time)
    iteration_latency: float = 0.0
    # tensors the driver worker broadcasts to the other tensor-parallel workers every iteration (vLLM V0's
    # broadcast_tensor_dict of the model input, vllm/distributed/parallel_state.py and worker/worker_base.py
    # _get_driver_input_and_broadcast, v0.5-0.6): each an NCCL broadcast over the TP group, serial on its stream, and on
    # each receiving worker ``tp_broadcast_dispatches`` eager dispatches for it (the tensor's allocation and the
    # broadcast's launch), each at specs/host_cost.py EAGER_OP_HOST and the host's Python speed where the loop is
    # Python, before that worker issues its forward pass, which the first all-reduce waits on (vllm-project/vllm#5792);
    # 0: none (SPMD workers that prepare their own input: vLLM V1, SGLang, TensorRT-LLM) and nothing at tp 1
    # (metrics.Setting.broadcast_time)
    tp_broadcast_tensors: int = 0
    tp_broadcast_dispatches: int = 0
    # seconds between two looks of a waiting worker at the queue through which the driver sends that input's metadata
    # (vLLM V0's shared-memory MessageQueue: time.sleep(1e-7) between looks, which the kernel's 50 us timer slack
    # stretches): the iteration waits for the last of the tp - 1 workers to look, tp_broadcast_poll x (tp - 1) / tp
    # on average (metrics.Setting.broadcast_time); 0: a worker that wakes on the write
    tp_broadcast_poll: float = 0.0
    # host seconds per running sequence that the engine spends while the GPU runs the iteration (vLLM V0's
    # asynchronous output processing from v0.6.0: the last iteration's outputs detokenised beside the forward pass,
    # PRs #7049 and #8050): hidden behind the GPU's step, the iteration lasts at least that long (metrics.Setting.time)
    hidden_sequence_overhead: float = 0.0
    # decode iterations replayed as captured CUDA graphs up to this many sequences per micro-batch (vLLM's
    # cudagraph capture sizes, SGLang's cuda_graph_max_bs, TensorRT-LLM's CudaGraphConfig.max_batch_size); 0: none
    # captured. A larger decode batch, and every iteration with prompt tokens where the engine graphs decode only,
    # runs eager: the host issues each kernel, ``eager_layer_overhead`` seconds of it per layer
    graph_max_batch: int = 0
    # the captured sizes up to graph_max_batch (always captured itself) where the engine pads a decode batch to the
    # next one (vLLM and SGLang: 1, 2, 4 and multiples of 8; TensorRT-LLM's padded graphs add powers of two above
    # 128): the graph runs the padding as dummy sequences (``graph_padding``). Empty: every size captured as it is
    graph_sizes: tuple[int, ...] = ()
    eager_layer_overhead: float = 0.0
    # and more per eager layer at tp > 1: its all-reduces' launches, issued only there (vLLM's RowParallelLinear.forward
    # all-reduces when tp_size > 1, vllm/model_executor/layers/linear.py: the attention's output, the down projection)
    eager_layer_tp_overhead: float = 0.0
    # kernels one decode layer launches in the engine's decode step, where a profile counted them; each beyond the
    # serving op list's own (iteration.layer_kernels: one kernel an op, and a reduction after each split-K GEMM) runs
    # for the accelerator's kernel_overhead more (roofline.overhead): the unfused rotary embedding and the cache
    # writes the op list folds into its ops. 0: the op list's count
    decode_layer_kernels: float = 0.0
    # a weight-only quantised GEMM (int8 or int4 weights, 16-bit activations) streams its weight bytes at this share
    # of the rate a 16-bit GEMM streams its own, its dequantisation in the kernel (``streamed_weight_bytes``); 1: as
    # fast, as Marlin's int4 kernel nearly is ("near-optimal 4x speedups up to batch sizes of 16-32", Frantar et al.
    # 2024, abstract); the other engines' kernels are taken as Marlin's, gpt-fast's as torchao measured them
    int8_weight_stream: float = 1.0
    int4_weight_stream: float = 1.0
    # the host prepares iteration n + 1 while the GPU runs iteration n (an overlap scheduler: TensorRT-LLM's PyTorch
    # backend, SGLang's), so an iteration takes max(GPU, host) seconds instead of their sum
    host_overlap: bool = False
    # the host loop is Python (PyTorch eager: TensorRT-LLM's PyTorch backend, vLLM, SGLang): its time scales with the
    # host CPU's Python speed (Cluster.python_host: Grace 2.5-2.8x an x86 DGX host)
    host_in_python: bool = False
    # the host loop is interpreter-bound Python (vLLM V0's scheduler, sequence objects and output processing): its time
    # scales with the host CPU's interpreter speed (Cluster.interpreter_host: Grace 1.15x an x86 DGX host) instead
    host_interpreted: bool = False
    # the engine build's GEMM library runs a GEMM of at most ``skinny_gemm_rows`` rows (decode's) at
    # ``skinny_gemm_rate`` of the modelled rate (untuned solutions: vLLM's ROCm build of 2024, F.linear through
    # rocBLAS / hipBLASLt without tuned GEMMs); 0 rows: every GEMM at the modelled rate
    skinny_gemm_rows: int = 0
    skinny_gemm_rate: float = 1.0
    # seconds the GPU idles between two kernels of an iteration beyond the accelerator's fixed time per kernel (the
    # runtime's dispatch of each node of a captured graph: vLLM's ROCm build of 2024 on ROCm 6.1); 0: none
    kernel_gap: float = 0.0
    # the engine runs its own tensor-parallel all-reduce kernel (vLLM's, SGLang's and TensorRT-LLM's custom all-reduce:
    # collectives/price.py SERVING); false: the GPU's collective library runs it (vLLM's ROCm build up to v0.6.1,
    # custom_all_reduce.py:17-22: RCCL, at RCCL's own tuner's price, collectives/protocols.py)
    engine_all_reduce: bool = True
    # how MoE layers under data-parallel attention reach their experts: all-to-all dispatch and combine of each
    # token's k copies ("all_to_all"), an all-gather of every token before the experts and a reduce-scatter of
    # their sums after ("all_gather": TensorRT-LLM's default under attention DP), or DeepEP ("deepep": SGLang's
    # DeepEP backend in its auto mode, DeepEP's normal kernels for iterations with prompt tokens, which send a token
    # once to each other node holding one of its experts and forward it over NVLink there, dispatch.py; its
    # low-latency kernels for pure decode iterations, every copy over RDMA, as "all_to_all")
    moe_comm: str = "all_to_all"
    # the executor's runtime batch-size tuning (TensorRT-LLM DynamicBatchConfig.enable_batch_size_tuning, which
    # trtllm-bench turns on): (limit, batch) pairs, ascending; an instance whose KV cache holds C sequences of the
    # running lengths runs at most the batch of the first pair with C < limit, else C rounded down to a multiple of
    # 512 when within 128 of it (cpp/tensorrt_llm/executor/dynamicBatchTuner.cpp getRuntimeBatchSize,
    # kBatchSizeFallbackGranularity 512, kBatchSizeFallbackThreshold 128); empty: no tuning
    batch_table: tuple[tuple[int, int], ...] = ()
    # multi-head latent attention in decode: the absorbed form (W_UK into the query, W_UV after attention: an MQA
    # over the cached latent, DeepSeek-V2 §2.1.2, FlashMLA) or the latent up-projected for every cached token
    mla_absorb: bool = True
    # decode attention with one thread block per query head (FasterTransformer's masked multi-head attention, which
    # TurboMind v0.1 runs): a GQA group's KV head is read once per query head, A/K times (ops.decode_attention);
    # False: the GQA-aware kernels (XQA, FlashInfer, FlashDecoding) read it once for the group
    kv_per_query_head: bool = False
    # data-parallel attention groups take their prompt chunks in the same iterations (TensorRT-LLM's
    # attention_dp_config enable_balance, "ADP Balance Strategy", tech blog 10); False: each group schedules its own
    # and an iteration waits for the group that carries one (metrics._with_chunks)
    dp_balance: bool = False
    # two-batch overlap: the batch as two micro-batches, one's MoE dispatch and combine overlapping the other's
    # computation (SGLang --enable-two-batch-overlap, DeepSeek's profile-data design; metrics.Setting.gpu_time)
    two_batch_overlap: bool = False
    # the context step runs each prompt but its last token, which the next decode step runs with the batch and samples
    # the first output token from (TurboMind v0.1: LlamaBatch::ContextDecode decodes ``missing - 1`` tokens, "-1 since
    # we skip last token", and a one-token prompt has no context step); False: the prefill samples the first token
    last_prompt_token_decoded: bool = False
    # a static batch's first request runs its first iteration alone, the others joining at the next (metrics._static:
    # TurboMind v0.1's idle engine wakes on the first enqueued request, Request.h RequestQueue::dequeue; its
    # benchmark's threads issue theirs one after another, benchmark/profile_generation.py); False: all together
    static_first_alone: bool = False

    def __post_init__(self) -> None:
        where = f"engine {self.name}: " if isinstance(self.name, str) else ""
        check_types(self, where)
        for name, variants in ENGINE_CHOICES.items():
            if getattr(self, name) not in variants:
                raise SpecError(f"{where}{name}={getattr(self, name)!r} must be one of {', '.join(variants)}")
        ranges.check_spec(self, where)
        self._check_table(where)
        sizes = self.graph_sizes
        if not (isinstance(sizes, tuple) and all(isinstance(v, int) and not isinstance(v, bool)
                                                 and 0 < v <= ranges.MAX_SIZE for v in sizes)):
            raise SpecError(f"{where}graph_sizes={sizes!r} must be captured batch sizes: integers from 1 to "
                            f"{ranges.MAX_SIZE:,}")

    def _check_table(self, where: str) -> None:
        table = self.batch_table
        pairs = isinstance(table, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                         for v in p) for p in table)
        if not pairs or any(a[0] >= b[0] for a, b in zip(table, table[1:], strict=False)):
            raise SpecError(f"{where}batch_table={table!r} must be (limit, batch) pairs of positive integers with "
                            "ascending limits")

    def with_(self, **changes: Any) -> Engine:
        return replace(self, **changes)

    def mode(self, name: str) -> Any:
        """The record of the engine's variant of field ``name`` (an ``ENGINE_CHOICES`` key)."""
        return ENGINE_CHOICES[name][getattr(self, name)]

    def resident(self, workload: Workload) -> float:
        """Tokens a running sequence holds pages for (``kv_reservation``): its mean context, or I + O."""
        if self.mode("kv_reservation").whole:
            return float(workload.input_len + workload.output_len)
        return float(workload.resident_context)

    @property
    def host(self) -> HostCost:
        """The engine's host costs as the one host record (specs/host_cost.py), what ``host_time``, ``hidden_time``
        and ``eager_time`` price."""
        return HostCost(per_iteration=self.iteration_overhead, per_sequence=self.sequence_overhead,
                        hidden_per_sequence=self.hidden_sequence_overhead, per_layer=self.eager_layer_overhead,
                        per_layer_tp=self.eager_layer_tp_overhead,
                        in_python=self.host_in_python, overlapped=self.host_overlap,
                        source=" ".join(x for x in (self.name, self.version, self.source) if x))

    def host_time(self, sequences: Any, pp: Any = 1, python_host: float = 1.0) -> Any:
        """The host's seconds per iteration for ``sequences`` running and prompted sequences per micro-batch over
        ``pp`` stages: iteration_overhead + sequence_overhead · sequences · pp, at the host CPU's Python speed when
        the host loop is Python (``host_in_python``)."""
        host = self.host
        return self._python(python_host) * (host.per_iteration + host.per_sequence * sequences * pp)

    def hidden_time(self, sequences: Any, pp: Any = 1, python_host: float = 1.0) -> Any:
        """The host's seconds per iteration that run beside the GPU's step: hidden_sequence_overhead · sequences · pp,
        at the host CPU's Python speed as ``host_time``."""
        return self._python(python_host) * self.host.hidden_per_sequence * sequences * pp

    def loop_speed(self, cluster: Cluster) -> float:
        """The host CPU's time per reference second for the engine's loop (``host_time``, ``hidden_time``): its
        interpreter's (Cluster.interpreter_speed) where the loop is interpreter-bound (``host_interpreted``), else its
        Python-side PyTorch work's (Cluster.python_host)."""
        return cluster.interpreter_speed if self.host_interpreted else cluster.python_host

    def _python(self, python_host: float) -> float:
        """The host CPU's time per reference second for this engine's host loop: its Python speed where the loop is
        Python (``host_in_python``), else 1."""
        return python_host if self.host.in_python else 1.0

    def eager_time(self, decode: Any, prompts: Any, layers: Any, python_host: float = 1.0, tp: Any = 1) -> Any:
        """The host's seconds to issue one eager iteration's kernels over ``layers`` layers, 0 where the iteration is
        a captured decode graph (``graph_max_batch``): pure decode (no ``prompts``) of at most that many sequences;
        per layer ``eager_layer_overhead``, and under tensor parallelism (``tp`` > 1) ``eager_layer_tp_overhead`` more
        for its all-reduces' launches. The kernels run asynchronously, so the GPU's step is at least this long
        (metrics.Setting.time)."""
        scale, host = self._python(python_host), self.host
        per_layer = host.per_layer + np.where(np.asarray(tp) > 1, host.per_layer_tp, 0.0)
        return np.where(self._graphed(decode, prompts), 0.0, scale * per_layer * layers)

    def _graphed(self, decode: Any, prompts: Any) -> Any:
        """Whether the iteration replays a captured decode graph: pure decode of at most ``graph_max_batch``."""
        return (np.asarray(prompts) <= 0) & (np.asarray(decode) <= self.graph_max_batch)

    def graph_padding(self, decode: Any, prompts: Any) -> Any:
        """Dummy rows a captured decode graph runs beside ``decode`` sequences: the smallest captured size at least D
        (``graph_sizes``), less D; 0 for an eager iteration (prompts, or more than ``graph_max_batch``) and where every
        size is captured. The engines pad so that one graph serves every batch up to its size (vLLM
        ``_get_graph_batch_size`` / ``pad_for_cudagraph``, SGLang's ``cuda_graph_runner``, TensorRT-LLM's
        ``CudaGraphConfig.enable_padding``)."""
        if not self.graph_sizes or not self.graph_max_batch:
            return 0.0
        sizes = np.asarray(sorted({s for s in self.graph_sizes if s < self.graph_max_batch} | {self.graph_max_batch}),
                           dtype=float)
        d = np.asarray(decode, dtype=float)
        at = np.minimum(np.searchsorted(sizes, d - 1e-9), len(sizes) - 1)
        pad = np.where(self._graphed(d, prompts) & (d > 0), sizes[at] - d, 0.0)
        return float(pad) if pad.ndim == 0 else pad  # plain numbers stay plain (gemm_shape.scalar_choice memoises)

    def streamed_weight_bytes(self, quant: Quant) -> float:
        """Bytes a GEMM's weights take to stream per element, as the iteration prices them: the scheme's own, over
        the engine's streaming rate where its weights are int8 or int4 and its activations 16-bit (weight-only)."""
        rate = {"int8": self.int8_weight_stream, "int4": self.int4_weight_stream}.get(quant.weights, 1.0)
        return quant.weight_bytes / (rate if quant.activations in ("bf16", "fp16") else 1.0)

    def runtime_batch(self, capacity: float) -> float:
        """The most sequences the executor runs when its KV cache holds ``capacity`` (``batch_table``)."""
        for limit, batch in self.batch_table:
            if capacity < limit:
                return min(float(batch), capacity)
        if not self.batch_table:
            return capacity
        floor = capacity // TUNER_GRANULARITY * TUNER_GRANULARITY
        return float(floor) if capacity < floor + TUNER_THRESHOLD else capacity

    def describe(self) -> str:
        return f"{self.name} {self.version}".strip()


DEFAULT = Engine()


def engine_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in (PRESETS / "engines").iterdir() if p.name.endswith(".toml"))


def engine_from_dict(data: dict[str, Any], where: str) -> Engine:
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a table of Engine fields")
    data = {k: v for k, v in data.items() if k != "sources"}
    if isinstance(data.get("graph_sizes"), list):
        data["graph_sizes"] = tuple(data["graph_sizes"])
    if isinstance(data.get("batch_table"), list):
        data["batch_table"] = tuple(tuple(pair) if isinstance(pair, list) else pair for pair in data["batch_table"])
    known = {f.name for f in fields(Engine)}
    if unknown := sorted(set(data) - known):
        raise unknown_field(where, unknown[0], known, "Engine's (meshplan/serve/engine.py)")
    if isinstance(data.get("workspace"), str):
        from meshplan.units import parse_quantity
        data["workspace"] = parse_quantity(data["workspace"], f"{where}.workspace", "B")
    return Engine(**data)


def load_engine(ref: str | Engine, field_name: str = "engine") -> Engine:
    """An engine preset by name (``vllm``), or a ``.toml`` file of Engine fields."""
    if isinstance(ref, Engine):
        return ref
    path = Path(ref)
    if path.suffix.lower() == ".toml":
        return engine_from_dict(read_toml(path, field_name, "engines"), f"{field_name}={str(path)!r}")
    if ref not in engine_names():
        raise not_a_preset(field_name, ref, engine_names(), "an engine preset or a .toml file")
    return _preset_engine(ref)


@cache
def _preset_engine(name: str) -> Engine:
    """An engine preset read once per process: the package's presets do not change under it, and Engine is frozen
    (an evaluation of every published serving run asks for its engine's preset thousands of times)."""
    return engine_from_dict(read_preset(f"engines/{name}.toml", f"preset {name}"), f"preset {name}")
