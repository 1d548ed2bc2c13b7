"""Megatron-Bridge overrides against Megatron-Bridge's own ConfigContainer (issue 80): every ``section.key=value``
that ``--emit nemo`` writes names a field of the config class ConfigContainer holds under that section, and every
``mixed_precision=NAME`` a recipe its registry holds, read from Megatron-Bridge 0.3.1's source (its PyPI wheel's
Python files, unpacked by .ci/parsers.py; the package itself imports Transformer Engine, a CUDA build, so it cannot
be imported on a CPU and its dataclasses are read as source with ``ast``). The config classes it takes from
Megatron-Core (TransformerConfig under GPTModelProvider, OptimizerConfig, DistributedDataParallelConfig) are the
dev extra's megatron-core 0.16.1, the release Megatron-Bridge 0.3.1 requires (megatron-core >= 0.15, < 0.17).
The ``model.*`` overrides also build Megatron-Core's TransformerConfig (tests/test_configs_framework_loaders.py).
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from framework_parsers import parser_path
from meshplan.configs import emit
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
BRIDGE = load_stack("megatron-bridge")


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}


def _fields(cls: ast.ClassDef) -> set[str]:
    """A dataclass's fields as its source declares them (annotated names in its body)."""
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _core_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.fixture(scope="module")
def bridge() -> dict[str, object]:
    """What Megatron-Bridge's source says: the sections of ConfigContainer and each one's fields, the recipes."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    root = parser_path("megatron-bridge")
    assert (root / "VERSION").read_text().strip() == "megatron-bridge==0.3.1"
    src = root / "megatron" / "bridge"
    config = _classes(src / "training" / "config.py")
    gpt = _classes(src / "models" / "gpt_provider.py")["GPTModelProvider"]
    mla = _classes(src / "models" / "mla_provider.py")["MLAModelProvider"]
    assert [ast.unparse(b) for b in gpt.bases][0] == "TransformerConfig"
    assert [ast.unparse(b) for b in mla.bases] == ["MLATransformerConfig", "GPTModelProvider"]
    recipes = {f.name for f in ast.parse((src / "training" / "mixed_precision.py").read_text()).body
               if isinstance(f, ast.FunctionDef) and any(ast.unparse(d) == "register" for d in f.decorator_list)}
    return {"sections": _fields(config["ConfigContainer"]), "recipes": recipes, "fields": {
        "train": _fields(config["TrainingConfig"]),
        "comm_overlap": _fields(_classes(src / "training" / "comm_overlap.py")["CommOverlapConfig"]),
        "model": _fields(gpt) | _core_fields(TransformerConfig),
        # an MLA model's recipe holds an MLAModelProvider (DeepSeek's, Kimi's): MLATransformerConfig's fields too
        "model_mla": _fields(mla) | _fields(gpt) | _core_fields(MLATransformerConfig),
        "optimizer": _core_fields(OptimizerConfig), "ddp": _core_fields(DistributedDataParallelConfig)}}


def _unknown(text: str, bridge: dict, mla: bool = False) -> list[str]:
    """The overrides of ``text`` that name no field of Megatron-Bridge's config classes (or no recipe); ``mla``: the
    model's recipe holds an MLAModelProvider."""
    bad = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        section, _, name = key.partition(".")
        if section not in bridge["sections"]:
            bad.append(line)
        elif section == "mixed_precision":
            bad += [line] if name or value not in bridge["recipes"] else []
        elif name not in bridge["fields"].get("model_mla" if mla and section == "model" else section, set()):
            bad.append(line)
    return bad


CASES = [  # (model, plan fields over dp=2 tp=2 pp=4 sp zero=1 on 16 GPUs, stack fields)
    ("llama3-8b", {}, {}),
    ("llama3-8b", {"vpp": 2, "schedule": "interleaved"}, {}),
    ("llama3-8b", {"recompute": "full", "recompute_layers": 2}, {}),
    ("llama3-8b", {"recompute": "selective", "recompute_modules": ("core_attn", "mlp")}, {}),
    ("llama3-8b", {"precision": "fp8"}, {"fp8_scaling": "current"}),
    ("llama3-8b", {"precision": "mxfp8"}, {}),
    ("llama3-8b", {"offload_optimizer": True, "pp": 1, "dp": 8}, {}),
    ("llama3-8b", {"offload_activations": True, "offload_layers": 4, "pp": 1, "dp": 8}, {"cuda_graphs": False}),
    ("llama3-8b", {"optimizer": "sgd-momentum"}, {}),
    ("llama3-8b", {"cp": 2, "dp": 1}, {"cp_comm": "allgather"}),
    ("qwen3-30b-a3b", {"ep": 2, "etp": 1}, {"expert_gemm": "grouped"}),
    ("deepseek-v3", {"ep": 2, "etp": 1, "last_stage_layers": 13}, {}),
    ("deepseek-v3", {"ep": 2, "etp": 1, "last_stage_layers": 13}, {"moe_dispatcher": "flex"}),
    ("llama4-scout", {"ep": 2, "etp": 1}, {}),
]


@pytest.mark.parametrize(("name", "fields", "stack"), CASES, ids=[f"{c[0]}-{'-'.join(c[1]) or 'base'}" for c in CASES])
def test_every_override_is_a_field_of_megatron_bridges_configs(bridge, name, fields, stack):
    plan = replace(Plan(dp=2, tp=2, pp=4, sequence_parallel=True, global_batch=64, micro_batch=1, zero=1), **fields)
    model = load_model(name)
    text = emit("nemo", model, plan, BRIDGE.with_(**stack))
    assert not _unknown(text, bridge, model.is_mla)
    assert any(line.startswith("mixed_precision=") for line in text.splitlines())


def test_a_key_megatron_bridge_lacks_is_found(bridge):
    """The check can fail: a misspelt field, an unknown section, a recipe that is not registered."""
    text = ("model.tensor_model_paralel_size=2\ntrainer.max_steps=10\nmixed_precision=bf16_fp8_mixed\n"
            "train.micro_batch_size=1")
    assert _unknown(text, bridge) == text.splitlines()[:3]
