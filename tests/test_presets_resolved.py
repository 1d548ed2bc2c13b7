"""Presets that extend one another (files.derived): a derived preset resolves to exactly the fields its old full file
gave, a table merges key by key, an array replaces the base's whole, and a bad ``extends`` is one line, exit status 2.

tests/data/presets_resolved.json froze the vLLM V0 engine presets as main's full files gave them (48602ecf), before
they were rewritten as their differences. A deliberate change of one of their values (a refit) changes it there too,
with the value the loader now gives::

    PYTHONPATH=src .venv/bin/python -c "import dataclasses, json; from meshplan.serve.engine import load_engine; \\
        print(json.dumps(dataclasses.asdict(load_engine('vllm-v0.6-rocm')), indent=1, sort_keys=True))"

tests/data/models_resolved.json froze every model preset as main's files gave it (ff309433), before the families
(megatron-*, mpt-*, ...) were rewritten as their differences over one member: each preset's fields that differ from
ModelSpec's defaults. A deliberate change of a model preset (a new preset, a corrected value) changes it there too
(``resolved_model`` below gives the entry).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bad_input_helpers import fails
from meshplan.errors import SpecError
from meshplan.files import PRESETS, derived, parse_toml
from meshplan.serve.engine import engine_names, load_engine
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.stack import load_stack

FROZEN = json.loads((Path(__file__).parent / "data" / "presets_resolved.json").read_text())["engines"]
MODELS = json.loads((Path(__file__).parent / "data" / "models_resolved.json").read_text())
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec) if f.default is not dataclasses.MISSING}
SERVE = ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--input-len", "100",
         "--output-len", "10", "--engine"]
# what vLLM's ROCm build of 2024 changes of its CUDA build (vllm-v0.6-rocm.toml, the section at its end)
ROCM_FIELDS = {"name", "version", "kv_per_query_head", "skinny_gemm_rows", "skinny_gemm_rate", "kernel_gap",
               "engine_all_reduce"}


def plain(obj: object) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(obj)))  # type: ignore[call-overload]


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_a_derived_engine_preset_resolves_to_the_fields_its_full_file_gave(name):
    assert plain(load_engine(name)) == FROZEN[name]


@pytest.mark.parametrize(("rocm", "cuda"), [("vllm-v0.5-rocm", "vllm-v0.5"), ("vllm-v0.6-rocm", "vllm-v0")])
def test_a_rocm_build_differs_from_its_cuda_build_in_the_rocm_fields_alone(rocm, cuda):
    # vllm-v0.5-rocm extends vllm-v0.6-rocm and repeats vllm-v0.5's three host-loop values: they stay in step
    a, b = plain(load_engine(rocm)), plain(load_engine(cuda))
    assert {k for k in a if a[k] != b[k]} <= ROCM_FIELDS


def resolved_model(name: str) -> dict:
    """A model preset's fields that differ from ModelSpec's defaults, as JSON gives them."""
    return {k: v for k, v in plain(load_model(name)).items() if k not in DEFAULTS or plain_value(DEFAULTS[k]) != v}


def plain_value(value: object) -> object:
    return json.loads(json.dumps(value))


def test_every_model_preset_is_frozen():
    assert preset_names() == sorted(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_preset_resolves_to_the_fields_its_full_file_gave(name):
    assert resolved_model(name) == MODELS[name]


def test_every_engine_preset_is_named_as_its_file():
    # a derived preset sets its own name (the scheduler presets' ``engines`` lists match it)
    assert [load_engine(n).name for n in engine_names()] == engine_names()


def test_a_table_merges_key_by_key_and_an_array_replaces_the_bases_whole(tmp_path):
    system = tmp_path / "h100-120gb.toml"
    system.write_text('extends = "h100"\nname = "h100-120gb"\n[accelerator]\nhbm_bytes = "120 GiB"\n')
    mine, h100 = load_system(str(system)), load_system("h100")
    assert mine.accelerator.hbm_bytes == 120 * 2**30
    assert dataclasses.replace(mine.accelerator, hbm_bytes=h100.accelerator.hbm_bytes) == h100.accelerator
    assert (mine.name, mine.network) == ("h100-120gb", h100.network)
    engine = tmp_path / "e.toml"
    engine.write_text('extends = "vllm-v0"\nname = "e"\ngraph_sizes = [1, 2]\ngraph_max_batch = 2\n')
    assert load_engine(str(engine)).graph_sizes == (1, 2)
    stack = tmp_path / "s.toml"
    stack.write_text('extends = "megatron-core"\nname = "s"\n[supports]\nzero = [0, 1]\n')
    mine_stack, core = load_stack(str(stack)), load_stack("megatron-core")
    assert mine_stack.supports == dataclasses.replace(core.supports, zero=(0, 1))
    model = tmp_path / "m.toml"
    model.write_text('extends = "llama3-8b"\nname = "m"\nnum_layers = 4\n')
    assert load_model(str(model)) == dataclasses.replace(load_model("llama3-8b"), name="m", num_layers=4)


def test_a_user_file_extends_a_file_beside_it_that_extends_a_preset(tmp_path):
    (tmp_path / "base.toml").write_text('extends = "vllm-v0.6.2-rocm-rocblas"\nkernel_gap = 5e-6\n')
    (tmp_path / "mine.toml").write_text('extends = "base.toml"\nname = "mine"\nmax_seqs = 64\n')
    got = load_engine(str(tmp_path / "mine.toml"))
    want = dataclasses.replace(load_engine("vllm-v0.6.2-rocm-rocblas"), name="mine", kernel_gap=5e-6, max_seqs=64)
    assert got == want


def test_a_cycle_of_presets_is_refused_naming_its_files(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b"\n')
    (tmp_path / "b.toml").write_text('extends = "a"\nname = "b"\n')
    path = tmp_path / "a.toml"
    with pytest.raises(SpecError) as info:
        derived(parse_toml(path.read_text(), "preset a"), path, "preset a", tmp_path)
    assert str(info.value) == (f"preset a (extends {tmp_path / 'b.toml'}): extends = 'a' makes a cycle: "
                               f"{tmp_path / 'a.toml'} -> {tmp_path / 'b.toml'} -> {tmp_path / 'a.toml'}")


def test_a_cycle_through_a_linked_folder_is_found(tmp_path):
    # the chain holds resolved paths: a preset target named through a symlinked folder is resolved too, so the cycle
    # a -> b -> a is one (unresolved, link/a.toml never equals real/a.toml and the chain recursed without end)
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.toml").write_text('extends = "b"\n')
    (real / "b.toml").write_text('extends = "a"\nname = "b"\n')
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    path = link / "a.toml"
    with pytest.raises(SpecError, match="makes a cycle"):
        derived(parse_toml(path.read_text(), "preset a"), path, "preset a", link)


def test_a_cycle_of_user_files_is_one_line_and_exit_status_2(tmp_path, capsys):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\nname = "a"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\nname = "b"\n')
    line = fails([*SERVE, str(tmp_path / "a.toml")], capsys)
    assert "makes a cycle" in line and f"{tmp_path / 'a.toml'} -> {tmp_path / 'b.toml'} -> " in line


@pytest.mark.parametrize(("value", "said"), [
    ('"vllm-v9"', "extends = 'vllm-v9' is neither a preset of presets/engines/ (generic, gpt-fast"),
    ('"../stacks/any"', "extends = '../stacks/any' is neither a preset of presets/engines/"),
    ('"nowhere.toml"', "nowhere.toml': no such file"),  # engine='…/e.toml': extends='…/nowhere.toml': no such file
    ("3", "extends must name a preset or a .toml file, not 3"),
    ('""', "extends must name a preset or a .toml file, not ''"),
    ('"a\\u0000.toml"', "extends must name a preset or a .toml file, not 'a\\x00.toml'"),
    (f'"{"x" * 300}.toml"', "the name is too long: a name in it is 305 bytes long (at most 255)"),
])
def test_a_bad_extends_is_one_line_and_exit_status_2(tmp_path, capsys, value, said):
    path = tmp_path / "e.toml"
    path.write_text(f'extends = {value}\nname = "e"\n')
    line = fails([*SERVE, str(path)], capsys)
    assert line.startswith(f"meshplan: error: engine={str(path)!r}") and said in line


def test_the_built_in_presets_extend_presets_of_their_own_folder():
    for path in PRESETS.glob("*/*.toml"):
        base = parse_toml(path.read_text(), path.name).get("extends")
        assert base is None or (path.parent / f"{base}.toml").is_file(), path
