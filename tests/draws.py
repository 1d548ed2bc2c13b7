"""Seeded random draws of valid (model, cluster, plan) triples, for the property tests (test_properties.py).

A triple is valid when ``check.check`` finds nothing wrong with it; it may still not fit in memory (that is a result,
not an error). Models are the presets (some with another sequence length or fewer layers) and small models of
random shape; systems are the presets, some with their measured GEMM efficiency removed so that the continuous rule
(efficiency.matmul_rule) prices them, some on three tiers, some with per-kernel overheads; plans draw every axis
and option the estimator takes.
"""

from __future__ import annotations

import random
from dataclasses import replace

from meshplan.specs.check import check
from meshplan.specs.hardware import Network, load_system, system_names
from meshplan.specs.mesh import TierSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.model_load import preset_names as model_names
from meshplan.specs.plan import FP8_ATTENTION_PRECISIONS, PRECISION, RECOMPUTE_MODULES, Plan
from meshplan.specs.stack import (
    ATTENTION_KERNELS,
    CROSS_ENTROPY,
    MOE_DISPATCHER,
    MOE_PERMUTE,
    OVERLAP_FLAGS,
    PROJECTIONS,
    Stack,
    load_stack,
    stack_names,
)

MODELS = sorted(model_names())
SYSTEMS = sorted(system_names())
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def draw_model(rng: random.Random) -> ModelSpec:
    """A preset (a third of them with another sequence length, a few cut to fewer layers) or a random small one."""
    if rng.random() < 0.75:
        model = load_model(rng.choice(MODELS))
        if rng.random() < 0.33:
            model = model.with_seq_length(rng.choice((512, 1024, 2048, 4096, 8192, 32768)))
        plain = not (model.layer_pattern or model.mtp_layers or model.window_layers)
        if rng.random() < 0.15 and plain and model.num_layers > 4:
            model = replace(model, num_layers=rng.randint(4, model.num_layers))
        return model
    heads = rng.choice((1, 2, 4, 8, 12, 16, 32, 64))
    head_dim = rng.choice((32, 64, 128))
    kv = rng.choice([d for d in divisors(heads)])
    moe = rng.random() < 0.3
    mlp = rng.choice(("gelu", "swiglu", "relu2"))
    extra: dict = {}
    if moe:
        experts = rng.choice((4, 8, 16, 64))
        extra = {"num_experts": experts, "moe_topk": rng.randint(1, min(8, experts)),
                 "moe_ffn_hidden_size": head_dim * heads * rng.choice((1, 2))}
    return ModelSpec(name="random", num_layers=rng.randint(1, 48), hidden_size=heads * head_dim, num_heads=heads,
                     num_kv_heads=kv, ffn_hidden_size=heads * head_dim * rng.choice((2, 4, 8)) // 2,
                     vocab_size=rng.choice((1000, 32000, 50257, 128256)), seq_length=rng.choice((256, 1024, 4096)),
                     mlp=mlp, norm=rng.choice(("layernorm", "rmsnorm")), dropout=rng.random() < 0.3,
                     tied_embeddings=rng.random() < 0.3, qkv_bias=rng.random() < 0.3, **extra)


def draw_system(rng: random.Random):
    """A system preset; a quarter of them without a measured GEMM efficiency (the continuous rule prices it), a
    fifth with their network split into three tiers (``three_tiers``), a tenth with per-kernel overheads (what
    calibrate fits: roofline.overhead)."""
    system = load_system(rng.choice(SYSTEMS))
    if rng.random() < 0.25:
        system = replace(system, accelerator=replace(system.accelerator, matmul_bf16=0.0, matmul_fp8=0.0))
    if rng.random() < 0.2 and not system.network.tiers:
        system = replace(system, network=three_tiers(rng, system.network))
    if rng.random() < 0.1:
        system = replace(system, accelerator=replace(system.accelerator, gemm_overhead=rng.choice((2e-6, 10e-6)),
                                                     kernel_overhead=rng.choice((1e-6, 5e-6))))
    return system


def three_tiers(rng: random.Random, net: Network) -> Network:
    """A two-tier network as three: the NVLink domain, a leaf of 2-8 domains at the NICs' bandwidth, and a spine
    over the leaves tapered 1-8:1 with a longer latency."""
    return Network(host_bandwidth=net.host_bandwidth, host_memory=net.host_memory, tiers=(
        TierSpec(name="nvlink", size=net.nvlink_domain, latency=net.nvlink_latency),
        TierSpec(name="leaf", size=rng.choice((2, 4, 8)), bandwidth=net.scale_out_bandwidth, latency=net.nic_latency),
        TierSpec(name="spine", bandwidth=net.scale_out_bandwidth, oversubscription=rng.choice((1, 2, 4, 8)),
                 latency=rng.choice((5e-6, 10e-6)))))


def draw_count(rng: random.Random, domain: int) -> int:
    n = rng.choice(COUNTS)
    return n if n <= domain or n % domain == 0 else domain * max(1, n // domain)


def _pick(rng: random.Random, values: list[int], small: float = 0.6) -> int:
    """One of ``values`` (increasing), the smaller ones more often."""
    weights = [small ** i for i in range(len(values))]
    return rng.choices(values, weights)[0]


def draw_plan(rng: random.Random, model: ModelSpec, n: int, precisions: tuple[str, ...]) -> Plan:
    """Any plan of ``n`` GPUs: the axes by random divisors, the options uniformly (check() filters)."""
    tp = _pick(rng, divisors(n))
    layout = "summa" if rng.random() < 0.15 else "1d"
    tp2 = _pick(rng, divisors(n // tp)) if layout == "summa" else 1
    pp = _pick(rng, divisors(n // (tp * tp2)))
    cp = _pick(rng, divisors(n // (tp * tp2 * pp)), 0.3)
    dp = n // (tp * tp2 * pp * cp)
    ep = _pick(rng, divisors(tp * cp * dp)) if model.is_moe else 1
    etp = rng.choice([d for d in divisors(tp * cp * dp) if (tp * cp * dp) % (ep * d) == 0]) if model.is_moe else tp
    vpp = rng.choice((1, 1, 2, 4)) if pp > 1 else 1
    mbs = rng.choice((1, 1, 2, 4))
    accum = rng.choice((1, 2, 4, 8, 16)) * (pp if vpp > 1 else 1)
    precision = rng.choice(precisions)
    recompute = rng.choice(("none", "selective", "full"))
    modules = ("core_attn",)
    if recompute == "selective" and rng.random() < 0.3:
        modules = tuple(rng.sample([m for m in RECOMPUTE_MODULES if m not in ("op_sac", "mla_up_proj") or (
            m == "mla_up_proj" and model.is_mla)], rng.randint(1, 3)))
        # torchtitan's per-op policy stands alone: it takes the draws of core_attn alone (the default the other 70 %
        # keep), so the seeded sequence of draws is the one it was before op_sac
        modules = ("op_sac",) if modules == ("core_attn",) else modules
    offload_act = rng.random() < 0.15
    return Plan(
        dp=dp, tp=tp, tp2=tp2, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=mbs, global_batch=dp * mbs * accum,
        zero=rng.choice((0, 1, 2, 3)), recompute=recompute, recompute_modules=modules,
        recompute_layers=rng.choice((0, 0, 1)) if recompute == "full" else 0,
        sequence_parallel=tp > 1 and layout == "1d" and rng.random() < 0.7,
        offload_optimizer=rng.random() < 0.15, offload_activations=offload_act,
        offload_layers=rng.choice((0, 1)) if offload_act else 0,
        precision=precision, grad_bytes=rng.choice((2, 4)),
        schedule="interleaved" if vpp > 1 else rng.choice(("1f1b", "1f1b", "gpipe")),
        finetune="lora" if rng.random() < 0.1 else "full", lora_rank=rng.choice((8, 32)), tensor_layout=layout,
        last_stage_layers=rng.choice((0, 0, 1, 2)) if pp > 1 else 0,
        placement=tuple(rng.sample(("tp", "tp2", "cp", "dp", "pp"), 5)) if rng.random() < 0.2 else
        ("tp", "tp2", "cp", "dp", "pp"),
    )


def draw_stack(rng: random.Random, model: ModelSpec, precision: str) -> Stack:
    """A stack preset with some of its fields drawn anew (every kernel, runtime and overlap option)."""
    stack = load_stack(rng.choice([n for n in stack_names() if n != "any"]))  # "any": generic's kernels again
    draws = {
        "overlap_tp": lambda: rng.random() < 0.4, "overlap_dp": lambda: rng.random() < 0.8,
        "overlap_pp": lambda: rng.random() < 0.4, "overlap_ep": lambda: model.is_moe and rng.random() < 0.2,
        "flash_attention": lambda: rng.random() < 0.85,
        "attention_kernel": lambda: rng.choice(ATTENTION_KERNELS if precision in FP8_ATTENTION_PRECISIONS
                                               else ("fused", "fa2")),
        "cross_entropy": lambda: rng.choice(CROSS_ENTROPY), "fusion": lambda: rng.choice(("fused", "eager")),
        "expert_gemm": lambda: rng.choice(("per_expert", "grouped")),
        "fp8_scaling": lambda: rng.choice(("delayed", "current")),
        "fsdp": lambda: rng.choice(("none", "fsdp1", "fsdp2")),
        "pipeline_runtime": lambda: rng.choice(("megatron", "torch")),
        "train_metrics": lambda: rng.choice((0, 2)), "varlen_attention": lambda: rng.random() < 0.1,
        "qkv_concat": lambda: rng.random() < 0.1, "cp_comm": lambda: rng.choice(("ring", "allgather")),
        "projections": lambda: rng.choice(PROJECTIONS), "moe_permute": lambda: rng.choice(MOE_PERMUTE),
        "moe_dispatcher": lambda: rng.choice(DRAWN_DISPATCHERS),
    }
    chosen = {k: f() for k, f in draws.items() if rng.random() < 0.3}
    if chosen.get("pipeline_runtime", stack.pipeline_runtime) == "megatron" and side_stream(rng).random() < 1 / 3:
        chosen["pipeline_runtime"] = "megatron-2021-01"  # Megatron-LM of January 2021 (whole sends) for a third of
        # Megatron's pipelines, preset or drawn, beside the generator: it moves only the replicated sends' estimates
    if chosen.get("pipeline_runtime", stack.pipeline_runtime) == "torch" and side_stream(rng).random() < 1 / 3:
        chosen["pipeline_runtime"] = "torch-reduce-after"  # NeMo AutoModel's (each run's gradients reduced after the
        # stage's last backward, exposed) for a third of torch's pipelines, beside the generator, as above
    if chosen.get("moe_dispatcher") == "alltoall" and stack.name == "megatron-core":  # flex where Megatron-Bridge's
        chosen["moe_dispatcher"] = "flex"  # DeepEP recipes run it, chosen without the generator (as below)
    drawn = stack.with_(**chosen)
    if stack.name in LOOP_HOST_PRESETS:  # chosen without the generator, so that the other draws stay as they were
        drawn = drawn.with_(microbatch_host=1.5e-3, iteration_host=1e-3)
    if stack.name == "megatron-deepspeed" and not any(getattr(drawn, f) for f in OVERLAP_FLAGS):  # alike: BigScience's
        drawn = drawn.with_(blocking_launches=True)  # CUDA_LAUNCH_BLOCKING=1, which needs every overlap off
    return drawn


def side_stream(rng: random.Random) -> random.Random:
    """A generator seeded from ``rng``'s state (its repr, hashed by SHA-512: random.seed of a str), which reading
    leaves as it was: a choice added after the seeded sequence of draws was fixed draws from it, so that the sequence
    (and every triple check() accepts from it) stays the one it was."""
    return random.Random(repr(rng.getstate()))


# the dispatchers drawn by the generator: those before "flex" (b200), so that the seeded sequence of draws is the one it
# was; draw_stack sets flex itself
DRAWN_DISPATCHERS = tuple(d for d in MOE_DISPATCHER if d != "flex")
assert len(DRAWN_DISPATCHERS) == 2, MOE_DISPATCHER

# stacks drawn with the training loop's host work (step/stages.loop_times, step/host.iteration_host): 1.5 ms a
# micro-batch and 1 ms a step, about the Megatron-LM CI profile's
LOOP_HOST_PRESETS = ("megatron-deepspeed", "megatron-core", "torchtitan")


def draw_triple(rng: random.Random, tries: int = 400):
    """(model, cluster, plan, stack) with check(model, cluster, plan, stack) == []."""
    while True:
        model, system = draw_model(rng), draw_system(rng)
        n = draw_count(rng, system.network.nvlink_domain)
        cluster = system.cluster(n)
        precisions = tuple(p for p in PRECISION if p in system.accelerator.peak_flops or
                           (p == "fp16" and "bf16" in system.accelerator.peak_flops))
        for _ in range(tries // 10):
            plan = draw_plan(rng, model, n, precisions)
            stack = draw_stack(rng, model, plan.precision)
            # FSDP's ZeRO-1 under torch's pipeline (check.fsdp_has_zero) stays out, as check left it out before it
            # existed, so that the seeded sequence of triples is the one it was (tests/test_torchtitan_pp.py draws it)
            if not check(model, cluster, plan, stack) and not (plan.zero == 1 and stack.fsdp_mode.shards):
                return model, cluster, plan, stack


def draw_kept(seed: int, n: int, keep) -> list:
    """The first ``n`` triples of ``draw_triple`` from ``random.Random(seed)`` that ``keep(model, cluster, plan,
    stack)`` accepts."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        triple = draw_triple(rng)
        if keep(*triple):
            out.append(triple)
    return out
