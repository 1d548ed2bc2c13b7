"""Every framework config format read back with each value replaced by what a hand-edited or Trainer-written config
holds: "auto", null, NaN, infinities, negatives, zero, huge numbers, strings, lists, tables, booleans. Each is either
read (the framework's default, "auto" said on stderr) or one SpecError naming the key, never a Python exception
(issue 48: 21 DeepSpeed configs were internal errors, exit 3), and never the reader's last-resort net
(configs.read's "unreadable value", which stands for a value no reader foresaw)."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from meshplan.configs import emit, read
from meshplan.errors import MeshplanError, SpecError
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

MODEL = load_model("llama3-8b")
JSON_VALUES = ["auto", None, float("nan"), float("inf"), -1, 0, 1e30, 10**30, "x", [], {}, True, 3.5]
TEXT_VALUES = ['"auto"', "nan", "inf", "-1", "0", "1e30", '"x"', "[]", "{}", "true", "3.5"]
ARG_VALUES = ["auto", "nan", "-1", "0", "1e30", "x", "3.5", "true", "", "null", "inf"]
PLANS = {"deepspeed": Plan(dp=16, micro_batch=2, global_batch=64, zero=1, recompute="full", offload_optimizer=True),
         "megatron": Plan(dp=4, tp=2, pp=2, micro_batch=1, global_batch=64, zero=1),
         "nemo": Plan(dp=4, tp=2, pp=2, micro_batch=1, global_batch=64, zero=1),
         "torchtitan": Plan(dp=4, tp=2, pp=2, micro_batch=1, global_batch=64, zero=1,
                           recompute_modules=("op_sac",))}
STACKS = {"deepspeed": "deepspeed", "megatron": "megatron-core", "nemo": "megatron-bridge", "torchtitan": "torchtitan"}


def _text(fmt: str) -> str:
    return emit(fmt, MODEL, PLANS[fmt], load_stack(STACKS[fmt]))


def _outcome(fmt: str, text: str) -> str:
    try:
        read(fmt, MODEL, 16, text=text)
    except MeshplanError as exc:
        assert "unreadable value" not in str(exc), str(exc)
        return str(exc)
    return "read"


def _paths(table: dict, prefix: tuple = ()):
    for key, value in table.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


def _deepspeed_variants():
    cfg = json.loads(_text("deepspeed"))
    keys = [*_paths(cfg), ("tensor_parallel",), ("tensor_parallel", "autotp_size"), ("fp16", "enabled"),
            ("optimizer", "params"), ("data_types",)]
    for path in keys:
        for value in JSON_VALUES:
            changed = json.loads(json.dumps(cfg))
            table = changed
            for key in path[:-1]:
                table = table.setdefault(key, {}) if isinstance(table.get(key, {}), dict) else None
                if table is None:
                    break
            if table is not None:
                table[path[-1]] = value
                yield f"{'.'.join(path)}={value!r}", json.dumps(changed)


def test_deepspeed_values_of_every_kind():
    outcomes = {label: _outcome("deepspeed", text) for label, text in _deepspeed_variants()}
    assert len(outcomes) > 200
    assert outcomes["train_batch_size=nan"] == "deepspeed config: train_batch_size=nan must be an integer ≥ 1"
    assert outcomes["zero_optimization={}"] == "read"  # an empty section: DeepSpeed's defaults
    assert outcomes["zero_optimization.stage=None"] == "read"
    assert outcomes["zero_optimization.offload_optimizer='auto'"].endswith(
        "zero_optimization.offload_optimizer='auto' must be an object like {\"device\": \"cpu\"}")


def test_text_formats_values_of_every_kind():
    """Megatron-LM arguments, Megatron-Bridge overrides: each argument's value replaced; torchtitan's TOML: each
    key's value replaced (kept where the result is valid TOML)."""
    count = 0
    for fmt in ("megatron", "nemo"):
        tokens = _text(fmt).split()
        for i, token in enumerate(tokens):
            if (fmt == "megatron" and token.startswith("--")) or (fmt == "nemo" and "=" not in token):
                continue
            for value in ARG_VALUES:
                new = value if fmt == "megatron" else f"{token.split('=')[0]}={value}"
                changed = [*tokens[:i], new, *tokens[i + 1:]]
                _outcome(fmt, (" " if fmt == "megatron" else "\n").join(changed))
                count += 1
    lines = _text("torchtitan").splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"(\w+\s*=\s*)", line)
        for value in TEXT_VALUES if match else ():
            text = "\n".join([*lines[:i], match.group(1) + value, *lines[i + 1:]])
            try:
                tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                continue
            _outcome("torchtitan", text)
            count += 1
    assert count > 500


def test_trainer_auto_is_read_as_its_default_and_said(capsys):
    """The Hugging Face Trainer's ds_config: "auto" micro-batch with a train_batch_size given is DeepSpeed's rule,
    16 / 1 / dp 16 = 1; without one, TrainingArguments.per_device_train_batch_size, 8 (train = 8 · 1 · 16 = 128)."""
    plan, _ = read("deepspeed", MODEL, 16, text=json.dumps({
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}))
    assert (plan.global_batch, plan.micro_batch, plan.grad_accum) == (16, 1, 1)
    note = capsys.readouterr().err.strip()
    assert note.startswith('meshplan: note: deepspeed config: "auto" read as the Hugging Face Trainer\'s defaults')
    assert "gradient_accumulation_steps=1, train_micro_batch_size_per_gpu=1 (= 16 / 1 / dp 16)" in note
    plan, _ = read("deepspeed", MODEL, 16, text=json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "fp16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "overlap_comm": "auto"}}))
    assert (plan.global_batch, plan.micro_batch, plan.zero, plan.precision) == (128, 8, 3, "bf16")
    assert "train_batch_size=128 (= 8 · 1 · dp 16)" in capsys.readouterr().err
    with pytest.raises(SpecError, match="train_batch_size=4 is less than gradient_accumulation_steps=1 · dp 16"):
        read("deepspeed", MODEL, 16, text=json.dumps({"train_batch_size": 4}))
