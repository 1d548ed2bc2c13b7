"""configs/: emit -> read reproduces the plan and the step time, for the best 1D plans of a search on a dense and a
MoE model, in every format; every option or key written is one the format's module cites (its docstring names the
framework's own argument / key names, from arguments.py, job_config.py, config-json, Megatron-Bridge's docs).
The frameworks' own config classes load the emitted files in tests/test_configs_deepspeed_loader.py (DeepSpeedConfig)
and tests/test_configs_framework_loaders.py (torchtitan's ConfigManager, Megatron-Core's TransformerConfig)."""

from __future__ import annotations

import importlib
import json
import re
import tomllib

import pytest

from meshplan.configs import FORMATS, detect, emit, read
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.stack import load_stack

# what each framework's plans may hold (the rest it refuses: tests/test_configs_refuse.py)
SPACES = {
    "megatron": ("megatron-core", {"zero": (0, 1), "offload_activations": (False,)}),
    "nemo": ("megatron-bridge", {"zero": (0, 1)}),
    "torchtitan": ("torchtitan", {"zero": (0, 1, 2, 3), "offload_optimizer": (False,),
                                  "offload_activations": (False,)}),
    "deepspeed": ("deepspeed", {"offload_activations": (False,), "recompute": ("none", "full"),
                                "sequence_parallel": (False,), "cp_max": 1}),
}
MODELS = (("llama3-8b", 64), ("mixtral-8x7b", 64))


def _top(fmt: str, name: str, gpus: int):
    model, cluster = load_model(name), load_system("h100").cluster(gpus)
    preset, space = SPACES[fmt]
    stack = load_stack(preset)
    result = search(model, cluster, Space(global_batch=256, layouts=("1d",), all_placements=False, stack=stack,
                                          **space), top_k=5, workers=1)
    return model, cluster, stack, result.plans


@pytest.mark.parametrize("name,gpus", MODELS)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_emit_then_read_gives_the_same_plan_and_step_time(fmt, name, gpus):
    model, cluster, stack, plans = _top(fmt, name, gpus)
    written = 0
    for est in plans:
        if fmt == "deepspeed" and (est.plan.pp > 1 or est.plan.ep > 1):
            continue  # DeepSpeed takes these in the training script
        text = emit(fmt, model, est.plan, stack)
        plan, back = read(fmt, model, gpus, text=text)
        assert plan == est.plan, text
        assert back == stack
        assert estimate(model, cluster, plan, back).step_time == est.step_time
        assert detect(text) == fmt
        written += 1
    assert written >= 1


def _documented(fmt: str) -> str:
    """The docstring of the format's module (configs/megatron.py, ...), where its option names are cited (the
    Megatron model's in configs/megatron_model.py)."""
    modules = [fmt] + (["megatron_model"] if fmt == "megatron" else [])
    return "".join(importlib.import_module(f"meshplan.configs.{m}").__doc__ or "" for m in modules)


@pytest.mark.parametrize("name,gpus", MODELS)
def test_megatron_arguments_are_the_cited_ones(name, gpus):
    model, _, stack, plans = _top("megatron", name, gpus)
    text = emit("megatron", model, plans[0].plan, stack)
    arguments = text[text.index("MEGATRON_ARGS=(\n"):text.index("\n)\n")]  # the torchrun line's are torchrun's
    flags = set(re.findall(r"(--[a-z0-9-]+)", arguments))
    assert "--tensor-model-parallel-size" in flags and "--global-batch-size" in flags
    assert not [f for f in flags if f"``{f}" not in _documented("megatron")]


def test_torchtitan_keys_are_the_cited_ones():
    model, _, stack, plans = _top("torchtitan", "llama3-8b", 64)
    data = tomllib.loads(emit("torchtitan", model, plans[0].plan, stack))
    keys = [k for section in ("training", "parallelism", "activation_checkpoint", "compile") for k in data[section]]
    assert "data_parallel_shard_degree" in keys and "local_batch_size" in keys
    assert not [k for k in keys if f"``{k}``" not in _documented("torchtitan")]


def test_deepspeed_keys_are_the_cited_ones_and_the_batch_adds_up():
    model, _, stack, plans = _top("deepspeed", "llama3-8b", 64)
    plan = plans[0].plan
    cfg = json.loads(emit("deepspeed", model, plan, stack))
    # DeepSpeed's own check (runtime/config.py _batch_assertion): train = micro · accumulation · data-parallel size
    micro, accum = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    assert cfg["train_batch_size"] == micro * accum * plan.dp
    keys = set(cfg) | {f"{k}" for k in cfg["zero_optimization"]}
    assert not [k for k in keys - {"meshplan"} if f"``{k}``" not in _documented("deepspeed")]


def test_nemo_keys_are_the_cited_ones():
    model, _, stack, plans = _top("nemo", "mixtral-8x7b", 64)
    text = emit("nemo", model, plans[0].plan, stack)
    keys = [ln.split("=")[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert "model.tensor_model_parallel_size" in keys and "train.global_batch_size" in keys
    doc = _documented("nemo")
    assert not [k for k in keys if f"``{k}``" not in doc and f"``{k.partition('.')[2]}``" not in doc]


def test_each_format_is_one_record_under_its_name():
    """configs/format.py: FORMATS holds one ConfigFormat per framework under its own name; its preset is a stack
    preset that loads, and the one `plan --emit` searches with (cli/emit.py EMIT_FRAMEWORK); its markers tell its
    own files apart (a text naming one marker is that format's, an empty text no format's)."""
    from meshplan.cli.emit import EMIT_FRAMEWORK

    assert sorted(FORMATS) == ["deepspeed", "megatron", "nemo", "torchtitan"]
    assert {name: f.preset for name, f in FORMATS.items()} == EMIT_FRAMEWORK
    for name, f in FORMATS.items():
        assert f.name == name and load_stack(f.preset).name
        assert all(f.written_in(marker) for marker in f.markers) and not f.written_in("")
