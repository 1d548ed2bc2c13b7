"""Megatron builds the model meshplan priced from the script meshplan emits (issue 47), for llama3-8b, llama3-70b,
mixtral-8x7b and deepseek-v3.

What runs: bash itself sources the emitted script with ``torchrun`` defined as a function that prints its argv, so the
arguments are exactly those pretrain_gpt.py would get (no comment or line continuation among them). Megatron-LM's own
parser is not on PyPI (megatron-core 0.16.1's wheel ships megatron/core only; there is no megatron-lm package), so
``parse_args`` / ``validate_args`` / ``core_transformer_config_from_args`` (megatron/training/arguments.py) are the
missing check: the arguments are turned into TransformerConfig fields as core_transformer_config_from_args does (every
argument named as a field, plus its translations: ``--swiglu`` gated_linear_unit with SiLU, ``--squared-relu``
Megatron-Core's squared_relu as activation_func, ``--disable-bias-linear``
add_bias_linear False, ``--num-experts`` num_moe_experts, ``--multi-latent-attention`` MLATransformerConfig,
``--moe-layer-freq`` evaluated, ``--group-query-attention`` enabling num_query_groups), then Megatron-Core's
TransformerConfig checks the emitted layout and GPTModel (local layer spec) is built on the meta device with every
parallel size 1. Two switches no parameter depends on are changed for the build on a CPU: the alltoall dispatcher asks
for a CUDA stream and the grouped GEMM for the grouped_gemm package, so the build runs allgather and per-expert MLPs
(the same weights); MLA's rotary embedding makes its frequency table (a buffer) on ``torch.cuda.current_device()``
whatever use_cpu_initialization says, which on a CPU build names the CPU; and the local spec's core attention
(DotProductAttention, no weights) does not take the ``k_channels`` MLA passes it in 0.16.1 (only Transformer Engine's
does), so the MLA build holds Megatron-Core's IdentityOp in its place; MLA's module sets HAVE_TE when Megatron-Core's
Transformer Engine extension imports, which it does without Transformer Engine (its TELinear then no class), so the
build says HAVE_TE False (it gates fp8 options of TE's linears only). The vocabulary is padded as Megatron-LM pads it
(megatron/core/tokenizers/utils/build_tokenizer.py: up to a multiple of make_vocab_size_divisible_by x tp), the
padded output layer meshplan prices (Stack.vocab_multiple); meshplan's weight count leaves the padded rows out.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from dataclasses import replace

import pytest

from meshplan.configs import emit
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import vocab_shard
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
PLAN = {"llama3-8b": Plan(dp=8, tp=8, global_batch=64), "llama3-70b": Plan(dp=4, tp=8, pp=2, global_batch=64),
        "mixtral-8x7b": Plan(dp=8, tp=8, ep=8, etp=1, global_batch=64),
        "deepseek-v3": Plan(dp=4, tp=8, pp=2, ep=4, etp=1, global_batch=64, last_stage_layers=29)}
_RENAMED = {"num_experts": "num_moe_experts", "fp8_format": "fp8"}


def launched_arguments(tmp_path, script: str) -> list[str]:
    """pretrain_gpt.py's argv as bash hands it over when the script runs (torchrun a function printing it)."""
    path = tmp_path / "pretrain.sh"
    path.write_text(script)
    shown = subprocess.run(["bash", "-c", f"torchrun() {{ printf '%s\\0' \"$@\"; }}; MASTER_ADDR=h; source {path}"],
                           capture_output=True, check=True).stdout.decode().split("\0")[:-1]
    return shown[shown.index("pretrain_gpt.py") + 1:]


def _typed(value: str) -> object:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _arguments(argv: list[str]) -> dict[str, object]:
    """argparse's namespace of the argv: dest names, numbers typed, flags True, lists as lists."""
    args: dict[str, object] = {}
    i = 0
    while i < len(argv):
        name = argv[i].removeprefix("--").replace("-", "_")
        values = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values.append(_typed(argv[i + 1]))
            i += 1
        i += 1
        args[name] = True if not values else values if name == "recompute_modules" else values[0]
    return args


def transformer_config(args: dict[str, object]):
    """core_transformer_config_from_args's translation (module docstring)."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if args.get("multi_latent_attention") else TransformerConfig
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {_RENAMED.get(k, k): v for k, v in args.items() if _RENAMED.get(k, k) in names}
    if not args.get("group_query_attention"):
        kw.pop("num_query_groups", None)
    if args.get("swiglu"):
        kw |= {"gated_linear_unit": True, "activation_func": torch.nn.functional.silu}
    if args.get("squared_relu"):  # arguments.py:1673-1675 @ core_v0.17.0
        from megatron.core.activations import squared_relu

        kw["activation_func"] = squared_relu
    kw["add_bias_linear"] = not args.get("disable_bias_linear")
    if isinstance(kw.get("moe_layer_freq"), str):
        kw["moe_layer_freq"] = eval(kw["moe_layer_freq"])  # Megatron-LM's moe_freq_type evaluates it the same way
    kw["num_layers_in_last_pipeline_stage"] = args.get("decoder_last_pipeline_num_layers")
    kw.pop("attention_backend", None)
    kw["pipeline_dtype"] = torch.bfloat16
    kw["bf16"] = "bf16" in args
    return cls(**kw)


def build_gpt(config, args: dict[str, object], vocab_size: int):
    """GPTModel of ``config`` on the meta device, every parallel size 1 (module docstring)."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec

    single = replace(config, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                     expert_model_parallel_size=1, expert_tensor_parallel_size=1, sequence_parallel=False,
                     virtual_pipeline_model_parallel_size=None, num_layers_in_last_pipeline_stage=None,
                     moe_grouped_gemm=False, moe_token_dispatcher_type="allgather", use_cpu_initialization=True,
                     perform_initialization=False, pipeline_dtype=None)
    block = get_gpt_decoder_block_spec(single, use_transformer_engine=False)  # pretrain_gpt.py's, without TE
    if config.multi_latent_attention:  # the local spec's core attention refuses MLA's k_channels (module docstring)
        from megatron.core.transformer.identity_op import IdentityOp

        for layer in block.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = IdentityOp
    mtp = get_gpt_mtp_block_spec(single, block.layer_specs[-1], use_transformer_engine=False) \
        if config.mtp_num_layers else None
    with torch.device("meta"):
        return GPTModel(config=single, transformer_layer_spec=block, vocab_size=vocab_size, mtp_block_spec=mtp,
                        max_sequence_length=int(args["max_position_embeddings"]),
                        position_embedding_type=str(args["position_embedding_type"]),
                        rotary_base=int(args.get("rotary_base", 10000)),
                        share_embeddings_and_output_weights=not args.get("untie_embeddings_and_output_weights"))


@pytest.fixture(scope="module")
def model_parallel():
    """Megatron-Core's process groups on one CPU process (gloo)."""
    import os
    import socket

    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as probe:  # a free port: a fixed one collides with another checkout's run of this test
        probe.bind(("127.0.0.1", 0))
        os.environ.setdefault("MASTER_PORT", str(probe.getsockname()[1]))
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


def _expert_bias(model: ModelSpec) -> int:
    """DeepSeek-V3's score-correction bias, a buffer in Megatron-Core (router.py expert_bias), a parameter in Hugging
    Face's count: E per MoE layer, the MTP layer's too (256 x (58 + 1))."""
    return model.num_experts * (model.num_moe_layers + model.mtp_layers) if model.router_bias else 0


def _padding(model: ModelSpec, padded: int) -> int:
    """The padded rows' weights, which meshplan's weight count leaves out (cost/embed_head.vocab_shard): the
    embedding's, and the output layer's when untied. At tp 8 each model here pads 768 rows (128,256 -> 129,024;
    32,000 -> 32,768; 129,280 -> 130,048)."""
    return (padded - model.vocab_size) * model.hidden_size * (1 if model.tied_embeddings else 2)


def _padded(model: ModelSpec, args: dict[str, object]) -> int:
    multiple = int(args.get("make_vocab_size_divisible_by", 128)) * int(args["tensor_model_parallel_size"])
    return math.ceil(model.vocab_size / multiple) * multiple


@pytest.mark.parametrize("name", list(PLAN))
def test_megatron_builds_the_priced_model_from_the_emitted_script(tmp_path, monkeypatch, model_parallel, name):
    import torch
    from megatron.core.transformer import multi_latent_attention

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # module docstring: MLA's RoPE table
    monkeypatch.setattr(multi_latent_attention, "HAVE_TE", False)  # module docstring: its TELinear stand-in
    model = load_model(name)
    args = _arguments(launched_arguments(tmp_path, emit("megatron", model, PLAN[name], load_stack("megatron-core"))))
    config = transformer_config(args)  # Megatron-Core's checks of the emitted layout
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
            config.expert_model_parallel_size) == (PLAN[name].tp, PLAN[name].pp, PLAN[name].ep)
    assert not config.add_bias_linear and config.hidden_dropout == config.attention_dropout == 0
    assert args["rotary_base"] == model.rope_theta and args["tokenizer_type"] == "HuggingFaceTokenizer"
    padded = _padded(model, args)  # Megatron's padding of the emitted divisor: the output layer meshplan priced
    assert padded == vocab_shard(model.vocab_size, PLAN[name].tp, 128) * PLAN[name].tp > model.vocab_size
    built = build_gpt(config, args, padded)
    params = sum(p.numel() for p in built.parameters())
    priced = model.params() + model.mtp_params() - _expert_bias(model) + _padding(model, padded)
    assert params == priced, (name, params, priced)
    assert tuple(built.embedding.word_embeddings.weight.shape) == (padded, model.hidden_size)
    if model.is_moe:
        assert args["moe_token_dispatcher_type"] == "alltoall"  # the megatron-core preset's, priced


def test_megatron_defaults_would_build_another_model(tmp_path, model_parallel):
    """Without the architecture flags (the script before issue 47: biases on, no --swiglu kept), Megatron builds a
    model of other parameters, so the test above can fail: llama3-8b with biases has 32 x (4096 + 1024 + 1024 +
    4096 + 2 x 14336 + 4096) = 1,392,640 more parameters."""
    model = load_model("llama3-8b")
    args = _arguments(launched_arguments(tmp_path, emit("megatron", model, PLAN["llama3-8b"],
                                                        load_stack("megatron-core"))))
    args.pop("disable_bias_linear")
    built = build_gpt(transformer_config(args), args, model.vocab_size)
    assert sum(p.numel() for p in built.parameters()) - model.params() == 32 * (4096 + 1024 + 1024 + 4096 + 2 * 14336
                                                                                 + 4096)


def _overrides(text: str) -> dict[str, object]:
    """The ``model.*`` overrides as OmegaConf would type them (true / false, numbers, [a,b] lists)."""
    out: dict[str, object] = {}
    for line in text.splitlines():
        if line.startswith("model.") and "=" in line:
            key, value = line.removeprefix("model.").split("=", 1)
            typed = {"true": True, "false": False}.get(value, value)
            if isinstance(typed, str) and typed.startswith("["):
                typed = [_typed(v) for v in typed.strip("[]").split(",") if v]
            out[key] = _typed(typed) if isinstance(typed, str) else typed
    return out


@pytest.mark.parametrize("name", list(PLAN))
def test_megatron_bridge_overrides_build_the_priced_model(tmp_path, monkeypatch, model_parallel, name):
    """The overrides alone (not the recipe's provider) hold the model: TransformerConfig of the ``model.*`` keys, with
    the recipe's activation (SiLU: gated_linear_unit makes it SwiGLU), builds the priced parameters."""
    import torch
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # module docstring: MLA's RoPE table
    monkeypatch.setattr(multi_latent_attention, "HAVE_TE", False)
    model = load_model(name)
    values = _overrides(emit("nemo", model, PLAN[name], load_stack("megatron-bridge")))
    cls = MLATransformerConfig if values.get("multi_latent_attention") else TransformerConfig
    names = {f.name for f in dataclasses.fields(cls)}
    config = cls(**{k: v for k, v in values.items() if k in names}, activation_func=torch.nn.functional.silu,
                 pipeline_dtype=torch.bfloat16)
    args = {"max_position_embeddings": values["seq_length"], "rotary_base": values["rotary_base"],
            "position_embedding_type": values["position_embedding_type"],
            "untie_embeddings_and_output_weights": not values["share_embeddings_and_output_weights"]}
    padded = int(values["vocab_size"])  # the priced output layer's, padded as Megatron pads it; not padded again
    assert padded == vocab_shard(model.vocab_size, PLAN[name].tp, 128) * PLAN[name].tp and padded % (
        int(values["make_vocab_size_divisible_by"]) * PLAN[name].tp) == 0
    built = build_gpt(config, args, padded)
    assert sum(p.numel() for p in built.parameters()) == model.params() + model.mtp_params() - _expert_bias(model) \
        + _padding(model, padded)


# the flex dispatcher's two backends as meshplan emits them (Stack.flex_backend): DeepEP, and HybridEP at
# Megatron-Core's 16 SMs (no --moe-hybridep-num-sms written) and at Megatron-Bridge's harness's 32 (written)
FLEX = {"deepep": ("deepep", None), "hybridep": ("hybridep", None), "hybridep-32sm": ("hybridep", 32)}


@pytest.mark.parametrize("backend", list(FLEX))
def test_megatron_core_accepts_the_emitted_flex_dispatcher(tmp_path, monkeypatch, model_parallel, backend):
    """The emitted flex dispatcher runs as written: the script's --moe-token-dispatcher-type flex,
    --moe-flex-dispatcher-backend and --moe-hybridep-num-sms are TransformerConfig fields of the installed
    Megatron-Core (0.16.1: moe_flex_dispatcher_backend 'deepep' | 'hybridep', moe_hybridep_num_sms default 16), its
    __post_init__ accepts them with the emitted layout (flex needs tp x ep > 1; deepep refuses padding to capacity),
    and the model it builds has the priced weights (the build itself runs allgather: module docstring). The
    Megatron-Bridge overrides (model.moe_flex_dispatcher_backend, model.moe_hybridep_num_sms) are the same fields."""
    import torch
    from megatron.core.transformer import multi_latent_attention

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(multi_latent_attention, "HAVE_TE", False)
    model, plan = load_model("deepseek-v3"), PLAN["deepseek-v3"]
    argument, sms = FLEX[backend]
    stack = load_stack("megatron-core").with_(moe_dispatcher="flex", flex_backend=backend)
    args = _arguments(launched_arguments(tmp_path, emit("megatron", model, plan, stack)))
    assert (args["moe_token_dispatcher_type"], args["moe_flex_dispatcher_backend"]) == ("flex", argument)
    assert args.get("moe_hybridep_num_sms") == sms
    config = transformer_config(args)
    assert (config.moe_token_dispatcher_type, config.moe_flex_dispatcher_backend) == ("flex", argument)
    assert config.moe_hybridep_num_sms == (sms or 16)  # Megatron-Core's default where none is written
    assert config.moe_deepep_num_sms == 20  # DeepEP's SMs: Megatron-Core's default, the one meshplan prices
    built = build_gpt(config, args, padded := _padded(model, args))
    assert sum(p.numel() for p in built.parameters()) == model.params() + model.mtp_params() - _expert_bias(model) \
        + _padding(model, padded)
    values = _overrides(emit("nemo", model, plan, load_stack("megatron-bridge").with_(moe_dispatcher="flex",
                                                                                       flex_backend=backend)))
    assert (values["moe_token_dispatcher_type"], values["moe_flex_dispatcher_backend"]) == ("flex", argument)
    assert values.get("moe_hybridep_num_sms") == sms


def test_megatron_core_refuses_a_flex_backend_it_does_not_have(model_parallel):
    """The check above can fail: TransformerConfig's own validation refuses what it does not run (DeepEP with the
    expert inputs padded to capacity, transformer_config.py __post_init__ @ core_v0.16.1)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_moe_experts": 8,
            "moe_router_topk": 2, "moe_token_dispatcher_type": "flex", "expert_model_parallel_size": 2,
            "moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}
    with pytest.raises(ValueError, match="deepep"):
        TransformerConfig(**base, moe_flex_dispatcher_backend="deepep")
    assert TransformerConfig(**base, moe_flex_dispatcher_backend="hybridep").moe_hybridep_num_sms == 16


def test_megatron_builds_nemotron4_15b_with_its_squared_relu(tmp_path, model_parallel):
    """Nemotron-4 15B (mlp "relu2") runs as written: the script says --squared-relu, the TransformerConfig of its
    arguments holds Megatron-Core's squared_relu (not the GeLU Megatron builds without it) and checks the layout
    (tp 8: 48 / 8 = 6 query heads and 8 / 8 = 1 query group a rank), and GPTModel has the priced parameters. The
    vocabulary 256,000 is a multiple of 128 x 8 = 1,024 (250 of them): nothing padded. Priced: 2 x 256,000 x 6,144
    embedding and output (untied) = 3,145,728,000, 2 x 6,144 final norm, and 32 layers of 2 x 2 x 6,144 norms,
    6,144 x (6,144 + 2 x 1,024) QKV, 6,144 x 6,144 out, 2 x 6,144 x 24,576 fc1 and fc2, no biases: 32 x 390,094,848 =
    12,483,035,136; 15,628,775,424 in all."""
    from megatron.core.activations import squared_relu

    model, plan = load_model("nemotron4-15b"), Plan(dp=8, tp=8, global_batch=64)
    argv = launched_arguments(tmp_path, emit("megatron", model, plan, load_stack("megatron-core")))
    assert "--squared-relu" in argv and "--swiglu" not in argv
    args = _arguments(argv)
    config = transformer_config(args)
    assert config.activation_func is squared_relu and not config.gated_linear_unit
    assert (config.tensor_model_parallel_size, config.num_query_groups, config.normalization) == (8, 8, "LayerNorm")
    assert _padded(model, args) == model.vocab_size == 250 * 1024
    built = build_gpt(config, args, model.vocab_size)
    params = sum(p.numel() for p in built.parameters())
    layer = 2 * 2 * 6144 + 6144 * (6144 + 2 * 1024) + 6144 * 6144 + 2 * 6144 * 24576
    assert params == model.params() == 2 * 256000 * 6144 + 2 * 6144 + 32 * layer == 15_628_775_424
    assert built.decoder.layers[0].mlp.activation_func is squared_relu
