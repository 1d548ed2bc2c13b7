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
    with pytest.raises(SpecError, match="from='missing.json': no such file"):
        read("missing.json", MODEL, 16)


def test_stack_fields_without_an_option_ride_in_the_meshplan_comment():
    """A generic stack through torchtitan: its fused kernels are said by [compile] and the comment; read back equal."""
    stack = load_stack("generic")
    plan = BASE.with_(zero=3, recompute_modules=("op_sac",))  # torchtitan's selective recompute
    text = emit("torchtitan", MODEL, plan, stack)
    assert "# meshplan: stack." in text
    assert read("torchtitan", MODEL, 16, text=text) == (plan, stack)


def test_the_content_outranks_the_suffix_and_an_empty_config_is_refused(tmp_path):
    """A DeepSpeed JSON saved as .txt (Megatron's suffix) is read as DeepSpeed's: its zero_optimization stage 2 and
    batch of 64 arrive, where reading it as Megatron arguments priced the defaults (zero=1 ... batch 0)."""
    stack = load_stack("deepspeed")
    plan = BASE.with_(tp=1, dp=16, sequence_parallel=False, zero=2, recompute="none")
    saved = tmp_path / "ds_config.txt"
    saved.write_text(emit("deepspeed", MODEL, plan, stack))
    assert detect(saved.read_text(), str(saved)) == "deepspeed"
    got = read(str(saved), MODEL, 16)[0]
    assert (got.dp, got.tp, got.zero, got.global_batch) == (16, 1, 2, 64)
    for name, text in (("empty.sh", ""), ("e.json", "{}"), ("e.toml", "foo = 1\n"), ("e.overrides", "a.b=1\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(SpecError, match="sets none of .* says nothing of the plan") as err:
            read(str(tmp_path / name), MODEL, 16)
        assert "\n" not in str(err.value)


def test_torchtitan_degrees_are_integers_that_multiply_to_the_data_parallel_size():
    """16 GPUs at tp 2: dp = 16 / 2 = 8, so replicate x shard must be 8 (shard -1: whatever is left)."""
    head = '[parallelism]\ntensor_parallel_degree = 2\n'
    with pytest.raises(SpecError, match=r"tensor_parallel_degree = 'x' must be an integer"):
        read("torchtitan", MODEL, 16, text='[parallelism]\ntensor_parallel_degree = "x"\n')
    with pytest.raises(SpecError, match=r"1 x 3 must be the data-parallel size 8"):
        read("torchtitan", MODEL, 16, text=head + "data_parallel_shard_degree = 3\n")
    assert read("torchtitan", MODEL, 16, text=head + "data_parallel_shard_degree = 8\n")[0].dp == 8
    assert read("torchtitan", MODEL, 16, text=head + "data_parallel_shard_degree = -1\n")[0].dp == 8
    with pytest.raises(SpecError, match="HSDP"):  # replicate 2 leaves shard -1 = 8 / 2 = 4 > 1
        read("torchtitan", MODEL, 16, text=head + "data_parallel_replicate_degree = 2\n")


@pytest.mark.parametrize("typo,meant", [("--micro-batch-sise", "--micro-batch-size"),
                                        ("--micro_batch_size", "--micro-batch-size"),
                                        ("--tensor-model-paralel-size", "--tensor-model-parallel-size"),
                                        ("--sequence-parallle", "--sequence-parallel")])
def test_a_misspelt_megatron_argument_is_refused_with_the_one_meant(typo, meant):
    text = emit("megatron", MODEL, BASE, load_stack("megatron-core")).replace("\n)\n", f"\n  {typo} 1\n)\n")
    with pytest.raises(SpecError, match=f"{typo} is not a Megatron-LM argument; did you mean {meant}"):
        read("megatron", MODEL, 16, text=text)


def test_megatron_arguments_meshplan_does_not_read_pass():
    """Megatron-LM's other arguments (the learning rate, --fp4-recipe one digit from --fp8-recipe,
    --tp-comm-overlap-ag beside --tp-comm-overlap) are not misspellings."""
    text = emit("megatron", MODEL, BASE, load_stack("megatron-core"))
    extra = "--lr 3e-4\n--train-iters 10\n--fp4-recipe nvfp4\n--tp-comm-overlap-ag\n"
    assert read("megatron", MODEL, 16, text=text + extra)[0].tp == 2


def test_the_megatron_arguments_known_are_those_the_module_writes_and_reads():
    """configs/megatron.py's KNOWN (what a misspelling is measured against) lists every argument its code and
    configs/megatron_model.py's name."""
    import re
    from pathlib import Path

    from meshplan.configs import megatron, megatron_model

    named = {flag for module in (megatron, megatron_model)
             for flag in re.findall(r'"(--[a-z0-9-]+)"', Path(module.__file__).read_text(encoding="utf-8"))}
    assert named == megatron.KNOWN


def test_a_megatron_script_whose_activation_is_not_the_models_is_refused():
    """--squared-relu builds Megatron-Core's squared_relu (arguments.py:1673-1675 @ core_v0.17.0): read for llama3-8b
    (SwiGLU) it is refused; a Nemotron script stating its MLP (--ffn-hidden-size) without it would build GeLU, and is
    refused too; with it, it reads back to the plan it was written from."""
    nemotron = load_model("nemotron4-15b")
    text = emit("megatron", nemotron, BASE, load_stack("megatron-core"))
    assert "  --squared-relu\n" in text
    assert read("megatron", nemotron, 16, text=text)[0] == BASE
    with pytest.raises(SpecError, match=r"--squared-relu does not build llama3-8b's MLP \(swiglu\)"):
        read("megatron", MODEL, 16, text=text)  # 32 layers both
    with pytest.raises(SpecError, match=r"no --squared-relu does not build nemotron4-15b's MLP \(relu2\)"):
        read("megatron", nemotron, 16, text=text.replace("  --squared-relu\n", ""))


def test_the_bridge_overrides_name_the_squared_relu_they_cannot_set():
    """Megatron-Bridge takes no callable as an override: no model.activation_func line, and a note naming the provider
    that sets squared ReLU (NemotronModelProvider @ v0.3.1)."""
    text = emit("nemo", load_model("nemotron4-15b"), BASE, load_stack("megatron-bridge"))
    assert not [line for line in text.splitlines() if line.startswith("model.activation_func")]
    assert "# model.activation_func is the recipe's (a callable, not an override): squared ReLU priced" in text
    assert "NemotronModelProvider" in text
