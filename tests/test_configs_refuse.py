"""configs/: a plan a framework cannot express is refused in one line naming the field and the framework; a config
meshplan cannot read is refused the same way; the format is told by the file's suffix or its content."""

from __future__ import annotations

import pytest

from meshplan.configs import detect, emit, read
from meshplan.errors import SpecError
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

MODEL = load_model("llama3-8b")
BASE = Plan(dp=8, tp=2, sequence_parallel=True, micro_batch=1, global_batch=64, zero=1)
SUMMA = BASE.with_(tp2=2, dp=4, tensor_layout="summa")


@pytest.mark.parametrize("fmt,plan,field", [
    *[(f, SUMMA, "tensor_layout") for f in ("megatron", "torchtitan", "deepspeed", "nemo")],
    ("deepspeed", BASE.with_(dp=4, cp=2, sequence_parallel=False), "cp"),
    ("deepspeed", BASE.with_(dp=4, pp=2, sequence_parallel=False), "pp"),
    ("torchtitan", BASE, "zero"),  # FSDP has no ZeRO-1
    ("torchtitan", BASE.with_(zero=3, sequence_parallel=False), "sequence_parallel"),
    ("megatron", BASE.with_(zero=3), "zero"),
    ("nemo", BASE.with_(zero=2), "zero"),
    ("megatron", BASE.with_(dp=4, pp=2, schedule="gpipe"), "schedule"),
    ("megatron", BASE.with_(finetune="lora"), "finetune"),
    ("megatron", BASE.with_(dp=4, cp=2, placement=("tp", "dp", "cp", "pp")), "placement"),
])
def test_an_inexpressible_plan_is_refused_naming_field_and_framework(fmt, plan, field):
    with pytest.raises(SpecError) as err:
        emit(fmt, MODEL, plan, load_stack("generic"))
    message = str(err.value)
    assert f"{fmt} cannot express {field}=" in message and "\n" not in message


def test_an_unknown_format_is_refused():
    with pytest.raises(SpecError, match="must be one of megatron"):
        emit("jax", MODEL, BASE, load_stack("generic"))


def test_the_format_is_told_by_suffix_or_content(tmp_path):
    stack = load_stack("megatron-core")
    text = emit("megatron", MODEL, BASE, stack)
    path = tmp_path / "run.sh"
    path.write_text(text)
    assert read(str(path), MODEL, 16) == (BASE, stack)
    assert detect(emit("nemo", MODEL, BASE, stack)) == "nemo"
    assert detect("{}", "ds_config.json") == "deepspeed"
    with pytest.raises(SpecError, match="cannot tell its format"):
        detect("hello")


def test_a_config_that_does_not_fit_the_gpus_or_model_is_refused():
    text = emit("megatron", MODEL, BASE, load_stack("megatron-core"))
    with pytest.raises(SpecError, match="does not divide gpus=15"):
        read("megatron", MODEL, 15, text=text)
    with pytest.raises(SpecError, match="--num-layers 32 is not"):
        read("megatron", load_model("llama2-13b"), 16, text=text)
    with pytest.raises(SpecError, match="torchtitan config"):
        read("torchtitan", MODEL, 16, text="[parallelism\n")
    with pytest.raises(SpecError, match="is not a file"):
        read("missing.json", MODEL, 16)


def test_stack_fields_without_an_option_ride_in_the_meshplan_comment():
    """A generic stack through torchtitan: its fused kernels are said by [compile] and the comment; read back equal."""
    stack = load_stack("generic")
    plan = BASE.with_(zero=3)
    text = emit("torchtitan", MODEL, plan, stack)
    assert "# meshplan: stack." in text
    assert read("torchtitan", MODEL, 16, text=text) == (plan, stack)
