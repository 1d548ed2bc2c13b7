"""Fuzz classes of the framework configs ``--from`` reads (issue 48, a second campaign): an option its framework
takes as a bool or one of a few strings, written as another kind or an unknown string, is refused naming the key;
never read by its truthiness (``[compile] enable = "false"`` priced a compiled model) nor taken as the default
(``context_parallel_rotate_method = "ring"`` priced as allgather)."""

from __future__ import annotations

import re

import pytest

from meshplan.cli import main
from meshplan.configs import emit, read
from meshplan.errors import SpecError
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

MODEL = load_model("llama3-8b")
PLAN = Plan(dp=8, tp=2, micro_batch=1, global_batch=64, zero=3, sequence_parallel=True, recompute_modules=("op_sac",))
TEXT = emit("torchtitan", MODEL, PLAN, load_stack("torchtitan"))
# (section, key, what the emitted config says): torchtitan's JobConfig fields of type bool or Literal
KEYS = [("compile", "enable", "false"), ("parallelism", "enable_async_tensor_parallel", "false"),
        ("parallelism", "fsdp_reshard_after_forward", '"always"'),
        ("parallelism", "context_parallel_rotate_method", '"alltoall"'),
        ("training", "mixed_precision_reduce", '"float32"')]
ODD = ['"false"', '"no"', "0", "1", "2", "[]", '"Ring"', "nan"]


@pytest.mark.parametrize(("section", "key", "written"), KEYS)
def test_a_torchtitan_flag_or_choice_of_another_kind_is_refused_naming_it(section, key, written):
    assert f"{key} = {written}" in TEXT
    assert read("torchtitan", MODEL, 16, text=TEXT)[0] == PLAN  # as written: read back
    for odd in ODD:
        with pytest.raises(SpecError, match=rf"{section}\.{key}=.* must be") as err:
            read("torchtitan", MODEL, 16, text=TEXT.replace(f"{key} = {written}", f"{key} = {odd}"))
        assert "\n" not in str(err.value)


def test_compile_enable_true_is_compiled_and_anything_else_but_false_is_refused(tmp_path, capsys):
    """Through the CLI: enable = true prices torch.compile's regions (stack.compiled), "false" exits 2, not 0."""
    path = tmp_path / "tt.toml"
    path.write_text(TEXT.replace("enable = false", "enable = true"))
    assert read(str(path), MODEL, 16)[1].compiled
    path.write_text(TEXT.replace("enable = false", 'enable = "false"'))
    assert main(["estimate", "--from", str(path), "--model", "llama3-8b", "--system", "h100", "--gpus", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compile.enable='false' must be true or false" in err[0]


MEGATRON = emit("megatron", MODEL, PLAN.with_(dp=4, cp=2, zero=1), load_stack("megatron-core"))
NEMO = emit("nemo", MODEL, PLAN.with_(dp=4, cp=2, zero=1), load_stack("nemo"))
# (format, text, the option as written, its field in the refusal): an enumerated option of Megatron's arguments or
# Megatron-Bridge's overrides; each used to fall back to the default on a value meshplan did not know
CHOICES = [("megatron", MEGATRON, "--cp-comm-type p2p", "--cp-comm-type {}", "cp_comm_type"),
           ("megatron", MEGATRON, "--attention-backend fused", "--attention-backend {}", "attention_backend"),
           ("megatron", MEGATRON, "--attention-backend fused", "--attention-backend fused --fp8-recipe {}",
            "fp8_recipe"),
           ("nemo", NEMO, "model.cp_comm_type=p2p", "model.cp_comm_type={}", "model.cp_comm_type"),
           ("nemo", NEMO, "mixed_precision=bf16_mixed", "mixed_precision={}", "mixed_precision")]


@pytest.mark.parametrize(("fmt", "text", "written", "odd", "field"), CHOICES)
def test_an_unknown_value_of_an_enumerated_option_is_refused_not_priced_as_its_default(fmt, text, written, odd,
                                                                                       field):
    """cp_comm_type a2a+p2p was priced as the ring (p2p), mixed_precision=bogus as bf16_mixed, attention_backend
    bogus as fused: each is now refused naming the option and the values meshplan reads."""
    assert written in text
    read(fmt, MODEL, 16, text=text)  # as written: read
    for value in ("bogus", "a2a+p2p", "P2P", "16"):
        with pytest.raises(SpecError, match=re.escape(f"{fmt} cannot express {field}={value}: meshplan reads")):
            read(fmt, MODEL, 16, text=text.replace(written, odd.format(value)))


@pytest.mark.parametrize(("stack", "enable"), [
    (load_stack("torchtitan"), False),  # eager, not compiled: torchtitan's benchmark stack
    (load_stack("torchtitan").with_(compiled=True, region_host=2.9e-4), True),  # --compiled: was enable = false
    (load_stack("generic"), True),  # fused kernels: torch.compile is torchtitan's one way to them
    (load_stack("torchtitan").with_(compiled=True, region_host=1e-3, fusion="fused"), True)])
def test_a_compiled_stack_is_written_with_compile_enabled_and_read_back_equal(stack, enable):
    """The job config a user launches compiles what meshplan priced as compiled: [compile] enable = true for a
    compiled stack (its eager element-wise kernels, if so, said in the meshplan comment), and read back equal."""
    text = emit("torchtitan", MODEL, PLAN, stack)
    assert f"[compile]\nenable = {str(enable).lower()}" in text
    assert read("torchtitan", MODEL, 16, text=text) == (PLAN, stack)
