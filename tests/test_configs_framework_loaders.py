"""The frameworks' own config classes load what meshplan emits, for every plan a search returns for that framework:

- torchtitan: the job TOML goes through torchtitan 0.2.2's ``ConfigManager.parse_args(["--job.config_file", path])``
  (torchtitan/config/manager.py: it rejects any key its JobConfig dataclasses lack, then runs its own checks), and
  the parallel degrees it read are the plan's. torchtitan's package ``__init__`` imports its MoE kernels and with them
  Triton, which a CPU machine lacks; the config modules need neither, so the package is entered without running it.
- Megatron-LM arguments: what Megatron-LM's ``core_transformer_config_from_args`` (megatron/training/arguments.py,
  NVIDIA/Megatron-LM) does with the parsed arguments: every argument named as a field of Megatron-Core's
  ``TransformerConfig`` becomes that field, plus its translations (``--num-experts`` → num_moe_experts, ``--swiglu`` →
  gated_linear_unit with SiLU, ``--decoder-last-pipeline-num-layers`` → num_layers_in_last_pipeline_stage, the
  pipeline dtype from ``--bf16`` / ``--fp16``). Megatron-Core's ``TransformerConfig.__post_init__`` then checks the
  layout (heads and query groups divisible by tp, experts by ep, sequence parallelism, recompute, virtual stages …).
  Megatron-LM's own parse_args, validate_args and core_transformer_config_from_args read the emitted scripts in
  tests/test_configs_megatron_lm.py (core_v0.17.0); this test keeps the dev extra's Megatron-Core 0.16.1 beside it.
- Megatron-Bridge overrides: ``model.*`` keys set fields of its GPTModelProvider, a subclass of Megatron-Core's
  TransformerConfig (Megatron-Bridge src/megatron/bridge/models/gpt_provider.py), so they build a TransformerConfig
  with the model's shape; ``ddp.*`` and ``optimizer.*`` keys build Megatron-Core's DistributedDataParallelConfig and
  OptimizerConfig. Megatron-Bridge itself needs Transformer Engine (a CUDA build), so every key is checked against
  the fields its ConfigContainer's classes declare in its source (tests/test_configs_megatron_bridge.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import sys
import types

import pytest

from meshplan.configs import emit
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

# Megatron-Core warns that Transformer Engine and Apex are missing (it falls back to PyTorch: nothing the configs use)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
CASES = [("llama3-8b", 32, 256), ("qwen3-30b-a3b", 16, 128), ("mixtral-8x7b", 64, 256)]


def _plans(framework: str, name: str, gpus: int, batch: int, **space: object):
    model = load_model(name)
    # no headroom, by time alone: with Space's defaults (the command line's), Megatron-Core's top 10 for mixtral-8x7b
    # holds an etp > 1 plan that Megatron's TransformerConfig refuses ("Bias in Moe is only supported when ETP==1")
    space = {"headroom": 0.0, "prefer_simple": False, **space}
    result = search(model, load_system("h100").cluster(gpus), Space(global_batch=batch, stack=load_stack(framework),
                                                                     **space), top_k=10, workers=1)
    assert len(result.plans) >= 3, (framework, name)
    return model, result.plans


# ---- torchtitan -----------------------------------------------------------------------------------------------------
def _torchtitan_config_manager():
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        assert spec is not None, "torchtitan is in the dev extra"
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = package
    from torchtitan.config.manager import ConfigManager

    return ConfigManager


@pytest.mark.parametrize(("name", "gpus", "batch"), CASES)
def test_torchtitan_loads_the_emitted_job_files(tmp_path, name, gpus, batch):
    config_manager = _torchtitan_config_manager()
    model, plans = _plans("torchtitan", name, gpus, batch)
    for i, est in enumerate(plans):
        plan = est.plan
        path = tmp_path / f"job{i}.toml"
        path.write_text(emit("torchtitan", model, plan, est.stack))
        job = config_manager().parse_args(["--job.config_file", str(path)])
        p = job.parallelism
        assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) \
            == (plan.tp, plan.pp, plan.cp), plan.describe()
        assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == plan.dp
        assert p.expert_parallel_degree == plan.ep
        # torchtitan's local batch is per data-parallel rank: gbs = local x dp x accumulation steps
        assert job.training.global_batch_size == plan.global_batch
        assert job.training.global_batch_size % (job.training.local_batch_size * plan.dp) == 0


def test_torchtitan_rejects_a_key_it_does_not_have(tmp_path):
    """The loader is strict, so the test above could fail: one unknown key and it refuses the file."""
    config_manager = _torchtitan_config_manager()
    model, plans = _plans("torchtitan", "llama3-8b", 32, 256)
    path = tmp_path / "job.toml"
    path.write_text(emit("torchtitan", model, plans[0].plan, plans[0].stack).replace(
        "[parallelism]\n", "[parallelism]\nno_such_degree = 2\n"))
    with pytest.raises(ValueError, match="no_such_degree"):
        config_manager().parse_args(["--job.config_file", str(path)])


# ---- Megatron-Core's TransformerConfig ------------------------------------------------------------------------------
def _arguments(text: str) -> dict[str, object]:
    """Megatron-LM's argument list as argparse would leave it: dest names, ints as ints, flags True, the
    store_false ``--no-overlap-p2p-communication`` as overlap_p2p_comm False, ``--fp8-format`` into ``fp8``."""
    text = text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("):text.index("\n)\n")]  # the script's arguments
    lines = [line.rstrip().removesuffix("\\") for line in text.splitlines() if not line.lstrip().startswith("#")]
    tokens = shlex.split(" ".join(lines))
    args: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        name = tokens[i].removeprefix("--").replace("-", "_")
        values = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            values.append(tokens[i + 1])
            i += 1
        i += 1
        if name == "no_overlap_p2p_communication":
            args["overlap_p2p_comm"] = False
            continue
        # validate_args: --num-virtual-stages-per-pipeline-rank becomes virtual_pipeline_model_parallel_size
        name = {"fp8_format": "fp8", "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size"
                }.get(name, name)
        typed = [int(v) if v.lstrip("-").isdigit() else v for v in values]
        args[name] = True if not typed else typed if name == "recompute_modules" else typed[0]
    return args


def _transformer_config(kwargs: dict[str, object]):
    import torch
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in kwargs.items() if k in fields}
    if kwargs.get("swiglu"):
        kw |= {"gated_linear_unit": True, "activation_func": torch.nn.functional.silu}
    if "num_experts" in kwargs:
        kw["num_moe_experts"] = kwargs["num_experts"]
    if "decoder_last_pipeline_num_layers" in kwargs:
        kw["num_layers_in_last_pipeline_stage"] = kwargs["decoder_last_pipeline_num_layers"]
    if isinstance(kw.get("attention_backend"), str):
        kw["attention_backend"] = AttnBackend[kw["attention_backend"]]
    kw["pipeline_dtype"] = torch.float16 if kwargs.get("fp16") else torch.bfloat16
    return TransformerConfig(**kw)


def _check_layout(config, plan: Plan, model: ModelSpec) -> None:
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.expert_model_parallel_size) == (plan.tp, plan.pp, plan.cp, plan.ep), plan.describe()
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.vpp
    assert bool(config.sequence_parallel) == plan.sequence_parallel
    assert config.num_layers == model.num_layers
    assert config.recompute_granularity == {"none": None, "selective": "selective", "full": "full"}[plan.recompute]


@pytest.mark.parametrize(("name", "gpus", "batch"), CASES)
def test_megatron_core_builds_its_transformer_config_from_the_emitted_arguments(name, gpus, batch):
    model, plans = _plans("megatron-core", name, gpus, batch)
    for est in plans:
        _check_layout(_transformer_config(_arguments(emit("megatron", model, est.plan, est.stack))), est.plan, model)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_megatron_core_builds_configs_of_recompute_and_fp8_plans(recompute):
    model, plans = _plans("megatron-core", "llama3-8b", 32, 256, recompute=(recompute,), precision="fp8")
    for est in plans:
        args = _arguments(emit("megatron", model, est.plan, est.stack))
        assert args["recompute_granularity"] == recompute and args["fp8"] in ("e4m3", "hybrid")
        _check_layout(_transformer_config(args), est.plan, model)
    if recompute == "full":  # Megatron-Bridge graphs its layers: Megatron-Core 0.16.1 refuses full recompute there
        return  # (specs/refusals.py cuda_graphs_with_full_recompute, tests/test_framework_refusals.py)
    model, plans = _plans("megatron-bridge", "llama3-8b", 32, 256, recompute=(recompute,), precision="fp8")
    for est in plans:
        overrides = _overrides(emit("nemo", model, est.plan, est.stack))["model"]
        _check_layout(_transformer_config(_shape(model) | overrides), est.plan, model)


def test_megatron_core_refuses_a_layout_its_config_cannot_hold():
    """TransformerConfig checks what it is given (so the tests above could fail): 32 heads over tp = 3."""
    model, plans = _plans("megatron-core", "llama3-8b", 32, 256)
    args = _arguments(emit("megatron", model, plans[0].plan, plans[0].stack)) | {"tensor_model_parallel_size": 3}
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        _transformer_config(args)


def _overrides(text: str) -> dict[str, dict[str, object]]:
    """Megatron-Bridge's ``section.key=value`` overrides (Hydra-style: true / false, ints, floats, [a,b] lists)."""
    out: dict[str, dict[str, object]] = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line or "." not in line.split("=", 1)[0]:
            continue
        key, value = line.split("=", 1)
        section, name = key.split(".", 1)
        typed: object = {"true": True, "false": False}.get(value, value)
        if isinstance(typed, str) and typed.lstrip("-").isdigit():
            typed = int(typed)
        elif isinstance(typed, str) and re.fullmatch(r"-?\d+\.\d*(e-?\d+)?|-?\d+e-?\d+", typed):
            typed = float(typed)
        elif isinstance(typed, str) and typed.startswith("["):
            typed = [v.strip() for v in typed.strip("[]").split(",") if v.strip()]
        out.setdefault(section, {})[name] = typed
    return out


def _shape(model: ModelSpec) -> dict[str, object]:
    """The model's shape as the recipe's provider holds it (the overrides carry only the layout)."""
    shape = {"num_layers": model.num_layers, "hidden_size": model.hidden_size, "num_attention_heads": model.num_heads,
             "num_query_groups": model.num_kv_heads, "ffn_hidden_size": model.ffn_hidden_size, "swiglu": True}
    if model.num_experts:
        shape |= {"num_experts": model.num_experts, "moe_router_topk": model.moe_topk,
                  "moe_ffn_hidden_size": model.moe_ffn_hidden_size}
    return shape


@pytest.mark.parametrize(("name", "gpus", "batch"), CASES)
def test_megatron_core_configs_take_the_megatron_bridge_overrides(name, gpus, batch):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    model, plans = _plans("megatron-bridge", name, gpus, batch)
    for est in plans:
        sections = _overrides(emit("nemo", model, est.plan, est.stack))
        _check_layout(_transformer_config(_shape(model) | sections["model"]), est.plan, model)
        ddp = DistributedDataParallelConfig(**sections.get("ddp", {}))
        optimizer = OptimizerConfig(**sections.get("optimizer", {}))
        assert ddp.use_distributed_optimizer == optimizer.use_distributed_optimizer == (est.plan.zero >= 1)


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_megatron_core_builds_the_flex_dispatcher_of_the_megatron_bridge_overrides(backend):
    """A flex stack's overrides: the dispatcher, its backend (the stack's: Stack.flex_backend) and the shared-expert
    overlap off (which Megatron-Core refuses under flex, and DeepSeek's recipe sets) build Megatron-Core's
    TransformerConfig and read back."""
    from meshplan.configs import read

    model, plans = _plans("megatron-bridge", "qwen3-30b-a3b", 16, 128)
    flex = plans[0].stack.with_(moe_dispatcher="flex", flex_backend=backend)
    text = emit("nemo", model, plans[0].plan, flex)
    overrides = _overrides(text)["model"]
    config = _transformer_config(_shape(model) | overrides | {"moe_shared_expert_overlap": True} | overrides)
    assert (config.moe_token_dispatcher_type, config.moe_flex_dispatcher_backend) == ("flex", backend)
    assert config.moe_shared_expert_overlap is False
    assert read("nemo", model, 16, text=text) == (plans[0].plan, flex)
    with pytest.raises(ValueError, match="moe_shared_expert_overlap only works with alltoall"):
        _transformer_config(_shape(model) | overrides | {"moe_shared_expert_intermediate_size": 1024,
                                                         "moe_shared_expert_overlap": True})


def test_megatron_core_builds_the_token_drop_of_the_megatron_bridge_overrides():
    """A token-drop plan's overrides (Plan.moe_expert_capacity_factor 1.0, padded to capacity, as Megatron-Bridge's
    apply_moe_token_drop sets them) build Megatron-Core's TransformerConfig with those two fields and read back; the
    padding alone is refused by TransformerConfig as by meshplan's check (specs/token_drop.py refusals)."""
    from dataclasses import replace

    from meshplan.configs import read

    model, plans = _plans("megatron-bridge", "qwen3-30b-a3b", 16, 128)
    plan = replace(plans[0].plan, moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    text = emit("nemo", model, plan, plans[0].stack)
    overrides = _overrides(text)["model"]
    config = _transformer_config(_shape(model) | overrides)
    assert (config.moe_expert_capacity_factor, config.moe_pad_expert_input_to_capacity) == (1.0, True)
    assert read("nemo", model, 16, text=text) == (plan, plans[0].stack)
    with pytest.raises(ValueError, match="moe_expert_capacity_factor"):
        _transformer_config(_shape(model) | overrides | {"moe_expert_capacity_factor": None})
