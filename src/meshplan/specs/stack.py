"""Stack: what a software stack does with a plan, apart from the plan (plan.py: the parallel layout).

A framework runs the same parallel layout with its own kernels (flash attention of one family or another, a fused
or an eager cross-entropy, element-wise kernels fused or one per aten op, per-expert or grouped MoE GEMMs), its own
data-parallel wrapper (Megatron's distributed optimizer or PyTorch FSDP) and pipeline runtime, and its own overlap of
communication with compute. Those choices move the step time and the memory as much as the layout does, so they are
a spec of their own, with presets as data: ``presets/stacks/<name>.toml``, each field beside the source that says
what the framework does (its arguments' defaults, its recipes, its code at a stated version). The estimator reads
the fields and never a framework's name.

``Stack()`` is meshplan's neutral default ("generic"): Megatron-style fused kernels, the data-parallel collectives
overlapped with the backward pass, nothing else overlapped."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types, not_a_preset, unknown_field
from meshplan.files import PRESETS, read_preset, read_toml
from meshplan.specs import stack_variants as variants
from meshplan.specs.fsdp_modes import FSDP_NAMES as FSDP
from meshplan.specs.fsdp_modes import FsdpMode, fsdp_of
from meshplan.specs.fusion import FUSION_NAMES as FUSION
from meshplan.specs.fusion import Fusion, fusion_of
from meshplan.specs.host_cost import HostCost, tp_hidden
from meshplan.specs.supports import Supports, supports_from_dict

# each choice's variants, from its registry (specs/stack_variants.py)
ATTENTION_KERNELS, CROSS_ENTROPY, EXPERT_GEMM = (variants.names_of("attention_kernel"), variants.LOSS_NAMES,
                                                 variants.EXPERT_GEMM_NAMES)
FP8_SCALING, PROJECTIONS, OPTIMIZER_WRAPPERS = (variants.FP8_SCALING_NAMES, variants.PROJECTION_NAMES,
                                                variants.WRAPPER_NAMES)
PIPELINE_RUNTIMES, CP_COMM = variants.names_of("pipeline_runtime"), variants.names_of("cp_comm")
MOE_PERMUTE, MOE_DISPATCHER = variants.names_of("moe_permute"), variants.names_of("moe_dispatcher")
FLEX_BACKENDS, MOE_ROUTING = variants.names_of("flex_backend"), ("uniform", "contiguous")  # Stack.moe_routing
DRAINED_PASSES = ("none", "forward", "both", "layers")  # Stack.drained_passes: which passes start drained

def _choice(default: str, choices: tuple[str, ...], help: str) -> Any:
    return field(default=default, metadata={"choices": choices, "help": help})

def _flag(default: bool, help: str) -> Any:
    return field(default=default, metadata={"help": help})

# the flags by which a stack runs communication beside compute (Stack's overlap section)
OVERLAP_FLAGS = ("overlap_tp", "overlap_dp", "overlap_ep", "overlap_pp")


@dataclass(frozen=True, kw_only=True)
class Stack:
    """How a software stack runs a plan: its kernels, runtime and overlap (module docstring). Equal stacks are the
    ones that behave alike: the name, version and source are labels."""

    name: str = field(default="generic", compare=False)
    version: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    # its frameworks' family (megatron, deepspeed, pytorch ...): the error bands' label (specs/regime.py); "": name
    family: str = field(default="", compare=False)
    # ---- kernels --------------------------------------------------------------------------------------------
    flash_attention: bool = _flag(True, "a fused (flash) attention kernel; false: the unfused softmax attention")
    attention_kernel: str = _choice(
        "fused", ATTENTION_KERNELS, "the flash kernel family: fused (cuDNN / FlashAttention-3 class, written for "
        "the GPU's asynchronous MMA), fa2 (FlashAttention-2 class) or fp8 (cuDNN's FP8 attention; fp8 plans)")
    cross_entropy: str = _choice(
        "fused", CROSS_ENTROPY, "the loss: fused (Megatron's vocabulary-parallel), pytorch (F.cross_entropy in "
        "eager autograd; its fp8 linears torchao's, keeping the 16-bit input), flash (flash-attn's kernel) or "
        "fused_grad (softmax, loss and gradient in one kernel that overwrites the logits: llm.c's fused_classifier) or "
        "vocab_parallel_eager (Megatron's vocabulary-parallel loss as its eager fp32 ops over upcast logits) or "
        "gathered_bf16 (F.cross_entropy on 16-bit logits all-gathered to every TP rank: KempnerForge)")
    fusion: str = _choice("fused", FUSION, "element-wise kernels: fused (Megatron / Transformer Engine, or "
        "torch.compile), eager (one PyTorch kernel per aten op), eager-te (eager, its norms TE's RMSNorm: NeMo "
        "AutoModel's), jit (Megatron-LM's module code of 2020-22: eager PyTorch with its own fused softmax and "
        "LayerNorm, TorchScript-fused bias-GeLU and bias-dropout-add; cost/eager.py), fused-eager-act (fused, NeMo "
        "2's eager squared ReLU) or eager-apex (InternEvo's: apex norms on fp32 upcasts; specs/fusion.py)")
    expert_gemm: str = _choice("per_expert", EXPERT_GEMM, "MoE expert GEMMs: per_expert (launched by the host "
                                                          "after the tokens-per-expert sync) or grouped (one kernel)")
    dglu_slowdown: float = field(default=1.0, metadata={"help": "with expert_gemm grouped, the fused backward GLU "
                                 "kernel at this many times its time: a release's regression (cost/mlp_moe.py)"})
    fp8_scaling: str = _choice("delayed", FP8_SCALING, "fp8 scales from the amax history (delayed) or from the "
                                                      "tensor itself (current: one more read before each cast)")
    varlen_attention: bool = _flag(False, "flash-attn's varlen interface: rows packed and unpacked around the kernel")
    qkv_concat: bool = _flag(False, "the fused QKV projection split with torch.split (its backward a concatenation)")
    projections: str = _choice(
        "fused", PROJECTIONS, "Q, K, V and the gate and up projections: fused (one GEMM each, split inside the kernels "
        "that read them: Megatron-Core), split (one GEMM each, split by torch.split / chunk, whose backward "
        "concatenates the gradients) or separate (a GEMM each, Hugging Face's q_proj, k_proj, v_proj, gate_proj, "
        "up_proj: autograd sums their input gradients)")
    moe_permute: str = _choice(
        "fused", MOE_PERMUTE, "MoE token permutation: fused (Transformer Engine's permute / unpermute kernels, "
        "Megatron-Core --moe-permute-fusion), gather_scatter (eager PyTorch: Megatron-Core's moe_utils without the "
        "fusion) or sort_gather (transformers' grouped_mm experts: fp32 weighting, inverse permutation, sum over k)")
    moe_dispatcher: str = _choice(
        "alltoall", MOE_DISPATCHER, "MoE token exchange: alltoall (permute, all-to-all over ep, all-gather the routed "
        "rows over etp), allgather (all-gather the tokens over etp x ep, permute locally; Megatron-Core "
        "--moe-token-dispatcher-type allgather) or flex (DeepEP / HybridEP: a token sent once to each other node "
        "holding one of its experts, fanned out over NVLink there; --moe-token-dispatcher-type flex)")
    flex_backend: str = _choice(
        "deepep", FLEX_BACKENDS, "the flex dispatcher's kernels (--moe-flex-dispatcher-backend), each priced at its "
        "own measured cross-node rate: deepep (DeepEP's normal kernels) or hybridep (NVIDIA's HybridEP); read only "
        "with moe_dispatcher flex")
    moe_routing: str = _choice("uniform", MOE_ROUTING, "a token's k experts over the flex dispatch's nodes: uniform or "
                               "contiguous (k in a row: AutoModel's FakeBalancedGate; collectives/dispatch.node_hit)")
    train_metrics: int = field(default=0, metadata={"help": "metric cross-entropies the trainer evaluates over each "
                                                            "micro-batch's logits (Composer's MPT: 2)"})
    vocab_multiple: int = field(default=1, metadata={
        "help": "the output layer's vocabulary padded to a multiple of this x tp, as Megatron-LM pads it "
                "(--make-vocab-size-divisible-by, default 128: megatron/core/tokenizers/utils/build_tokenizer.py); "
                "1: the model's own (cost/embed_head.py)"})
    # ---- runtime --------------------------------------------------------------------------------------------
    fsdp: str = _choice("none", FSDP, "data parallelism by PyTorch FSDP (its per-micro-batch gradient "
                                      "preparation): fsdp1 (FlatParameter), fsdp2 (fully_shard) or none")
    accumulate_unsharded: bool = _flag(False, "gradient accumulation without communication: the gradient sync "
        "skipped on every micro-batch but the last (FSDP2 set_requires_gradient_sync(False)), so under ZeRO 2 / 3 each "
        "GPU keeps its gradients unsharded in the reduce dtype until the last backward (memory.model_states), and "
        "reduces them once per update (step/channels.zero_traffic, accumulation_time)")
    param_sync: str = _choice("all_gather", ("all_gather", "shard_broadcasts"), "ZeRO 1 / 2's updated weights back "
                              "on every rank: all_gather or shard_broadcasts (one broadcast per rank: step/param_sync)")
    grad_sync: str = _choice("reduce_scatter", ("reduce_scatter", "all_reduce"), "ZeRO 1 / 2's gradients: "
        "reduce_scatter within the ZeRO group (then all-reduced across instances) or all_reduce over dp*cp")
    master_weights: bool = _flag(True, "an fp32 master copy of the 16-bit weights beside them (mixed precision); "
        "false: the model is cast to 16 bits and torch.optim updates it in place, its state and gradients in the "
        "weights' dtype (memory.model_states, step/channels.step_bytes, goodput.saved_state_bytes)")
    replicated_embedding: bool = _flag(False, "the token embedding kept whole on every tensor-parallel rank, not "
                                              "split over the vocabulary: its weights, gradients and optimizer "
                                              "state tp times a vocabulary-parallel one's (memory.model_states)")
    gathered_ends: bool = _flag(False, "FSDP2 leaves the root unit (token embedding, final norm, output head) "
                                       "gathered from its forward to the backward's end and the last block from its "
                                       "forward into its backward under ZeRO-3 (torchtitan's last block, and the root "
                                       "as the torch of 2024 kept it): their compute-dtype weights beside the logits "
                                       "(step/memory.gathered_ends)")
    expandable_segments: bool = _flag(False, "the training loop's caching allocator runs with expandable segments "
        "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torchtitan's launch script) and frees its 16-bit logits "
        "before the loss's backward: the upcast eager loss's reserved hole (step/memory.logits_hole)")
    pipeline_runtime: str = _choice("megatron", PIPELINE_RUNTIMES, "what the pipeline keeps, sends and reduces: "
                                    "megatron, torch (pipelining), torch-reduce-after or megatron-2021-01 "
                                    "(specs/pipeline_runtime.py)")
    schedule_batch: int = field(default=0, metadata={"help": "sequences per data-parallel rank in one run of the "
        "pipeline schedule: a step runs it once per this many (NeMo AutoModel: local_batch_size), each run with its "
        "own fill, drain and gradient sync (step/stages.schedule_runs); 0: the step's batch in one run"})
    cp_comm: str = _choice("ring", CP_COMM, "context-parallel K/V exchange: ring (p2p) or allgather")
    host_dispatch: float = field(default=0.0, metadata={
        "help": "host CPU seconds per launched kernel (Python module call, dispatcher, wrapper, launch): eager "
                "PyTorch 11-18 us per op (NVIDIA dgxc-benchmarking cpu_overhead), torch Linear 13.5 us on an x86 "
                "host, 33-37 us on Grace (TransformerEngine #2053); a pass takes at least its kernels x this "
                "(step/passes.py); `meshplan calibrate --stack-out` measures it on this host; 0: the host never "
                "limits"})
    collective_host: float = field(default=0.0, metadata={
        "help": "host CPU seconds per collective call (an NCCL all-reduce, all-gather ... issued from the model's "
                "code: c10d's dispatch and the enqueue, without the Python module code around a kernel that "
                "host_dispatch averages); 0: a kernel's (host_dispatch), or none with collective_host_stated"})
    collective_host_stated: bool = _flag(False, "collective_host as written, 0 too (0: the host issues no call)")
    compiled: bool = _flag(False, "each layer runs under torch.compile (Inductor's default mode: torchtitan's "
        "[compile] enable): its element-wise kernels fused (fusion fused) but about eager PyTorch's kernel count "
        "launched, each by the compiled region's wrapper (cost/eager.py)")
    region_host: float = field(default=0.0, metadata={
        "help": "host CPU seconds per compiled region (a layer under torch.compile) and pass beyond its launches: "
                "Dynamo's guards and AOTAutograd's runtime wrapper (TORCH_COMPILE_REGION_HOST); 0: no region"})
    tensor_host: float = field(default=0.0, metadata={
        "help": "host CPU seconds per parameter tensor per optimizer step on an x86 DGX host: the per-parameter "
                "loops and eager ops of the optimizer, its mixed-precision wrapper, the data-parallel wrapper and "
                "per-parameter logging, run after the step's synchronisation (step/host.step_host; cost/tensors.py "
                "counts the tensors); 0: none"})
    tensor_host_queued: float = field(default=0.0, metadata={
        "help": "the part of tensor_host that the optimizer step issues before its first synchronisation, behind the "
                "data-parallel gradient all-reduce it has just queued (Megatron's fp16 wrapper: the fp16 main_grad "
                "casts, before the found-inf .item()): hidden under that all-reduce up to its time rather than added "
                "(step/host.optimizer_loops); 0: all of it after the synchronisation"})
    expert_tensors: int = field(default=0, metadata={
        "help": "the routed experts of a layer held as this many stacked tensors (torchtitan's grouped w1, w2, w3: 3; "
                "transformers' gate_up_proj, down_proj: 2), each with its bias where the experts have biases; 0: an "
                "fc1 and an fc2 per local expert, as Megatron-Core's TEGroupedMLP and SequentialMLP hold them "
                "(cost/tensors.py)"})
    tensor_sharded: bool = _flag(False, "the optimizer wrapper's per-parameter loops run over its own ZeRO shard at "
                                        "ZeRO 1 and 2 (Megatron's DistributedOptimizer, DeepSpeed's ZeRO-1/2 "
                                        "optimizer); false: over every tensor on the GPU (cost/tensors.py)")
    optimizer_wrapper: str = _choice(
        "stated", OPTIMIZER_WRAPPERS, "the optimizer wrapper whose per-parameter loops the step pays: stated (this "
        "stack's tensor_host and tensor_sharded), or the one DeepSpeed's engine picks per plan from the precision, "
        "ZeRO stage, gradient bytes and offload (deepspeed; deepspeed-pipeline under its pipeline engine, as "
        "Megatron-DeepSpeed runs it), at its counted host cost (cost/wrappers.py)")
    microbatch_host: float = field(default=0.0, metadata={
        "help": "host CPU seconds per micro-batch on each pipeline rank, on an x86 DGX host, that the GPU waits out: "
                "the training loop's own work around the model (the batch's fetch and copy, the loss's reduction, "
                "timers that synchronise the device), behind a synchronisation that drains the queue "
                "(step/stages.py); 0: none counted"})
    iteration_host: float = field(default=0.0, metadata={
        "help": "host CPU seconds per training step, on an x86 DGX host, that the GPU waits out: the loop's "
                "per-step logging and bookkeeping after the step's synchronisation (step/host.step_host); 0: none "
                "counted"})
    drained_passes: str = _choice(
        "none", DRAINED_PASSES, "the passes of every micro-batch that start from an empty GPU queue, behind a host "
        "synchronisation of the training loop: forward (loss.item() after each backward), both (a Python branch on a "
        "device tensor between the passes too), layers (both, and every layer's pass from an empty queue: step/host.py)"
        " or none; a drained pass gathers its first weights alone (step/channels.py)")
    cuda_graphs: bool = _flag(False, "the layers are captured as CUDA graphs (Megatron-Core --cuda-graph-impl, "
                                     "torch.compile mode='reduce-overhead'): the host launches one graph per layer "
                                     "and pass, not each kernel")
    blocking_collectives: bool = _flag(False, "the host waits for each exposed collective to finish "
        "(TORCH_NCCL_BLOCKING_WAIT, or a loop that reads a collective's result on the host): each drains the host's "
        "lead (step/host.py); false: PyTorch's NCCL calls return once enqueued and the lead carries on")
    blocking_launches: bool = _flag(False, "every kernel launch returns only once its kernel has run "
        "(CUDA_LAUNCH_BLOCKING=1): the host and the GPU take turns, and a pass takes its host time plus its GPU time "
        "(step/host.py); no stream overlaps another, so it needs every overlap_* false")
    # ---- overlap --------------------------------------------------------------------------------------------
    overlap_tp: bool = _flag(False, "TP collectives overlapped with the GEMMs (Megatron --tp-comm-overlap)")
    overlap_tp_needs_sp: bool = _flag(False, "without sequence parallelism the framework turns overlap_tp off "
                                             "(specs/host_cost.py: Megatron-Bridge, NeMo); false: as stated")
    overlap_dp: bool = _flag(True, "the data-parallel collectives overlapped with the passes (overlap-grad-reduce)")
    overlap_param_gather: bool = _flag(True, "with overlap_dp, ZeRO-1 / 2's weight gather beside the first forward "
                                             "(Megatron overlap_param_gather); false: before it, exposed")
    overlap_ep: bool = _flag(False, "MoE all-to-alls behind another micro-batch's compute (combined 1F1B)")
    overlap_pp: bool = _flag(False, "pipeline sends behind the next chunk's compute (interleaved schedules)")
    # ---- what plans it runs (supports.py): the search's space, not the price of a plan ----------------------
    supports: Supports = field(default_factory=Supports, compare=False)

    def __post_init__(self) -> None:
        where = f"stack {self.name}: " if isinstance(self.name, str) else ""
        check_types(self, where)
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise SpecError(f"{where}{f.name}={getattr(self, f.name)!r} must be one of {', '.join(choices)}")
        ranges.check_spec(self, where)
        if self.region_host and not self.compiled:  # a region's host time, with no region: never silently dropped
            raise SpecError(f"{where}region_host={self.region_host} s needs compiled = true (--compiled: each layer "
                            "a torch.compile region); 0 without")
        overlaps = [f for f in OVERLAP_FLAGS if getattr(self, f)]
        if self.blocking_launches and overlaps:  # a blocked launch serialises the streams: no overlap to price
            raise SpecError(f"{where}blocking_launches=true (CUDA_LAUNCH_BLOCKING=1) runs one kernel at a time, so "
                            f"{', '.join(f'{f}=true' for f in overlaps)} cannot overlap: set them false with it ("
                            + " ".join("--no-" + f.replace("_", "-") for f in overlaps) + ")")
        if self.tensor_host_queued > self.tensor_host:  # a part of the loops, never more than they
            raise SpecError(f"{where}tensor_host_queued={self.tensor_host_queued} s is part of tensor_host="
                            f"{self.tensor_host} s: give at most tensor_host")
        if self.wrapper.per_plan and (self.tensor_host or self.tensor_sharded):  # never silently dropped
            raise SpecError(f"{where}tensor_host={self.tensor_host} s / tensor_sharded={self.tensor_sharded} state the "
                            f"optimizer wrapper's loops, which optimizer_wrapper={self.optimizer_wrapper} picks per "
                            "plan (cost/wrappers.py): give optimizer_wrapper = stated with them, or leave them out")

    @property
    def fusion_mode(self) -> Fusion:
        """The record of the stack's fusion (specs/fusion.py): what the cost model does under it."""
        return fusion_of(self.fusion)

    # the records of the stack's choices (specs/stack_variants.py): what the cost model does under each
    @property
    def loss(self) -> variants.Loss:
        return variants.cross_entropy_of(self.cross_entropy)

    @property
    def projection_mode(self) -> variants.Projections:
        return variants.projections_of(self.projections)

    @property
    def expert_gemm_mode(self) -> variants.ExpertGemm:
        return variants.expert_gemm_of(self.expert_gemm)

    @property
    def fp8_scaling_mode(self) -> variants.Fp8Scaling:
        return variants.fp8_scaling_of(self.fp8_scaling)

    @property
    def wrapper(self) -> variants.Wrapper:
        return variants.wrapper_of(self.optimizer_wrapper)

    @property
    def attention_kernel_mode(self) -> variants.AttentionKernel:
        return variants.choice_of("attention_kernel", self.attention_kernel)

    @property
    def cp_comm_mode(self) -> variants.CpComm:
        return variants.choice_of("cp_comm", self.cp_comm)

    @property
    def moe_permute_mode(self) -> variants.MoePermute:
        return variants.choice_of("moe_permute", self.moe_permute)

    @property
    def moe_dispatcher_mode(self) -> variants.MoeDispatcher:
        return variants.choice_of("moe_dispatcher", self.moe_dispatcher)

    @property
    def flex_backend_mode(self) -> variants.FlexBackend:
        return variants.choice_of("flex_backend", self.flex_backend)

    @property
    def pipeline_runtime_mode(self) -> variants.PipelineRuntime:
        return variants.choice_of("pipeline_runtime", self.pipeline_runtime)

    @property
    def fsdp_mode(self) -> FsdpMode:
        """The record of the stack's FSDP mode (specs/fsdp_modes.py)."""
        return fsdp_of(self.fsdp)

    @property
    def host(self) -> HostCost:
        """The stack's host's cost of issuing work (specs/host_cost.py; a plan's: plan_host), for step/host.py."""
        stated = self.collective_host_stated or self.collective_host > 0  # else None: a kernel's (HostCost.per_call)
        label = " ".join(x for x in (self.name, self.version, self.source) if x)
        return HostCost(per_kernel=self.host_dispatch, per_collective=self.collective_host if stated else None,
                        per_region=self.region_host, compiled=self.compiled, cuda_graphs=self.cuda_graphs,
                        blocking_collectives=self.blocking_collectives, blocking_launches=self.blocking_launches,
                        drained_layers=self.drained_passes == "layers", hidden_tp=tp_hidden(self), source=label)

    def with_(self, **changes: Any) -> Stack:
        return replace(self, **changes)

    def describe(self) -> str:
        """The fields that differ from the generic default, as ``name: field=value ...``."""
        default = Stack()
        changed = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                   if f.compare and getattr(self, f.name) != getattr(default, f.name)]
        return " ".join([self.name, *changed])

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "supports"}


DEFAULT = Stack()
# A layer under torch.compile (each TransformerBlock compiled with fullgraph, Inductor's default mode, as torchtitan's
# apply_compile does; PyTorch 2.11) costs its host 0.27-0.32 ms a pass beyond launching its kernels at the eager host
# cost per kernel: the compiled GPT layer's host time a layer at micro-batch 1 less 9 forward / 40 backward kernels at
# its eager twin's cost per kernel on the same H200 host (forward 0.275 and 0.319 ms at width 1024 and 2048, backward
# 0.305 ms at 1024; data/measured/gpu/2026-11-26c-nvidia-h200-small-work-compiled.json, docs/SMALL_WORK_GPU.md
# run C, tests/test_small_work_gpu.py)
TORCH_COMPILE_REGION_HOST = 0.29e-3
# the framework the Python API (estimate, Space) and the command line run by default: a mainstream one, so that the
# first answer is a plan the user can launch (``any``: every plan meshplan models, the 2D SUMMA layout included);
# ``DEFAULT`` (generic) is the neutral stack the physics' own tests price
DEFAULT_FRAMEWORK = "megatron-core"
BEHAVIOUR = tuple(f.name for f in fields(Stack) if f.compare)  # the fields the estimator reads


def stack_names() -> list[str]:
    return list(_preset_names())


@cache
def _preset_names() -> tuple[str, ...]:
    """The stack presets, listed once per process (the package's presets do not change under it)."""
    root = PRESETS / "stacks"
    return tuple(sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml")))


def stack_from_dict(data: dict[str, Any], where: str) -> Stack:
    """A Stack from a preset's table (its keys: Stack's fields)."""
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a table of Stack fields")
    known = {f.name for f in fields(Stack)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise unknown_field(where, unknown[0], known, "Stack's (meshplan/stack.py)")
    if "supports" in data:
        data = {**data, "supports": supports_from_dict(data["supports"], where)}
    return Stack(**data)


def load_stack(ref: str | Stack, field_name: str = "framework") -> Stack:
    """A stack preset by name (``torchtitan``), or a ``.toml`` file of Stack fields."""
    if isinstance(ref, Stack):
        return ref
    path = Path(ref)
    if path.suffix.lower() == ".toml":
        return stack_from_dict(read_toml(path, field_name, "stacks"), f"{field_name}={str(path)!r}")
    if ref not in _preset_names():
        raise not_a_preset(field_name, ref, stack_names(), "a stack preset or a .toml file")
    return _preset_stack(ref)


@cache
def _preset_stack(name: str) -> Stack:
    """A stack preset read once per process (frozen; a search's ranking asks which presets run each plan)."""
    return stack_from_dict(read_preset(f"stacks/{name}.toml", f"preset {name}"), f"preset {name}")


FRAMEWORK_STACK = load_stack(DEFAULT_FRAMEWORK)  # the stack of DEFAULT_FRAMEWORK: estimate's and Space's default


def frameworks_running(plan: Any, model: Any = None) -> list[str]:
    """The framework presets whose ``supports`` run ``plan`` (a Plan; with its ``model``, also none of the preset's
    refusals refuses it); "any" and "generic" are not frameworks."""
    stacks = [_preset_stack(name) for name in stack_names() if name not in ("any", "generic")]
    return [s.name for s in stacks if s.supports.runs(plan, model, s)]


def stack_modules(modules: tuple[str, ...], stack: Stack) -> tuple[str, ...]:
    """``modules`` as the framework of ``stack`` runs selective recompute: the default (Megatron-Core's core_attn)
    becomes its own where it has none (torchtitan: op_sac, its per-op policy); modules it does not run are refused."""
    runs = stack.supports.recompute_modules
    if modules == ("core_attn",) and "core_attn" not in runs:
        return runs[:1]
    if not stack.supports.runs_modules(modules):
        missing = next(m for m in modules if m not in runs)
        raise SpecError(f"recompute_modules={','.join(modules)}: framework {stack.name} does not run {missing} "
                        f"(its selective recompute: {', '.join(runs)}; --framework any prices every module)")
    return modules
