"""The registries of variants (DESIGN.md: never compare a variant's name outside its registry).

The pipeline schedules' registry (meshplan.pipeline.registry, issue 82): one record per schedule, and no module of
the core outside ``meshplan.pipeline`` writes a schedule's name (a string constant equal to one: compared, keyed,
listed or passed); each caller asks the registry. Attribute names that happen to equal a schedule's (the search
space's ``gpipe`` switch, set in its ``__post_init__``) are not schedule names. The per-rank path prices a plan as
the end ranks' path does: the same plan with its default per-rank settings written out prices the same.

The other families, whose names are common words ("fused", "eager", "none"), are checked by comparison instead: no
module of the core outside a family's registry compares the field that names the variant (``stack.fusion``:
specs/fusion.py; ``plan.tensor_layout``: specs/layouts.py; ``stack.fsdp``: specs/fsdp_modes.py; ``stack.cross_entropy``,
``stack.optimizer_wrapper``, ``stack.projections``, ``stack.expert_gemm``, ``stack.fp8_scaling``,
``stack.attention_kernel``, ``stack.cp_comm``, ``stack.moe_permute``, ``stack.moe_dispatcher`` and
``stack.pipeline_runtime``: specs/stack_variants.py; the engine's ``prefill``, ``kv_reservation``, ``moe_comm``,
``kv_overflow`` and ``memory_basis``: serve/engine.py ENGINE_CHOICES) or a stack's or an
engine's preset name with a string (``==``, ``!=``, ``in`` a literal tuple); it reads the record or looks the name up
in a keyed table."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from meshplan.estimate import estimate
from meshplan.pipeline.names import ALL, ASYNC, SPLIT, SYNC
from meshplan.pipeline.registry import REGISTRY, SEARCH_ORDER, schedule_of
from meshplan.serve.engine import ENGINE_CHOICES, Engine
from meshplan.specs import fsdp_modes, fusion, layouts, stack_variants
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import LAYOUTS, Plan
from meshplan.specs.stack import load_stack

CORE = Path(__file__).resolve().parents[1] / "src" / "meshplan"
ATTRIBUTE_CALLS = ("setattr", "__setattr__", "getattr")


@cache
def _tree(path: Path) -> ast.Module:
    """``path`` parsed once for both source checks below (each reads every module of the core: a second or two of
    parsing), the trees dropped after this file's tests (``_trees_dropped``)."""
    return ast.parse(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module", autouse=True)
def _trees_dropped():
    yield
    _tree.cache_clear()


def _names_written(path: Path) -> list[str]:
    """``file:line 'name'`` of each string constant in ``path`` equal to a schedule's name, but an attribute's name
    given to setattr / getattr."""
    tree = _tree(path)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ATTRIBUTE_CALLS:
                skip.add(id(node.args[1]))  # setattr(obj, "name", ...), object.__setattr__(self, "name", ...)
    return [f"{path.name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in ALL and id(node) not in skip]


def test_no_schedule_name_is_written_outside_the_pipeline_package():
    files = [p for p in sorted(CORE.rglob("*.py")) if "pipeline" not in p.relative_to(CORE).parts[:1]]
    found = [hit for p in files for hit in _names_written(p)]
    assert not found, "schedule names outside meshplan.pipeline (ask its registry):\n" + "\n".join(found)


def test_no_pipeline_module_but_the_registry_forks_on_a_schedule_s_name():
    # inside the package too, adding a schedule is one record: the tables, the closed forms, the report's timelines
    # and the warm-ups ask the records (their fields and functions), none compares or keys a name
    files = [p for p in sorted((CORE / "pipeline").glob("*.py")) if p.name not in ("names.py", "registry.py")]
    found = [hit for p in files for hit in _names_written(p)]
    assert not found, "schedule names in meshplan.pipeline outside its registry:\n" + "\n".join(found)


def _family_compared(path: Path) -> list[str]:
    """``file:line`` of each comparison of an object's ``family`` with a string (``record.family != "sync"``)."""
    return [f"{path.name}:{node.lineno}" for node in ast.walk(_tree(path)) if isinstance(node, ast.Compare)
            and any(isinstance(x, ast.Attribute) and x.attr == "family" for x in (node.left, *node.comparators))
            and any(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (node.left, *node.comparators))]


def test_no_module_but_the_registry_compares_a_schedule_s_family():
    # a family is asked of the record (flushes, split, opt_in) or of registry.by_family, never compared by its word
    files = [p for p in sorted(CORE.rglob("*.py")) if p != CORE / "pipeline" / "registry.py"]
    found = [hit for p in files for hit in _family_compared(p)]
    assert not found, "a schedule's family compared outside the registry (ask the record):\n" + "\n".join(found)
    assert _family_compared(CORE / "pipeline" / "registry.py")  # the check sees a comparison where there is one
    assert {s.name for s in REGISTRY.values() if s.opt_in} == {*ASYNC, *SPLIT}  # searched only when asked


def test_the_page_s_timeline_script_knows_no_schedule_by_name():
    # the report's page builds tables.build's tables from each rank's warm-up its data carries (detail.replay_inputs)
    script = (CORE / "report" / "templates" / "timeline.js").read_text(encoding="utf-8")
    assert not [name for name in ALL if f'"{name}"' in script or f"'{name}'" in script]


def test_the_check_sees_a_written_name(tmp_path):
    # the check above is not vacuous: the registry itself writes every name, and a comparison in a module is seen,
    # an attribute's name given to object.__setattr__ is not
    assert {h.rsplit(" ", 1)[1].strip("'") for h in _names_written(CORE / "pipeline" / "registry.py")} == set(ALL)
    probe = tmp_path / "probe.py"
    probe.write_text('def f(plan):\n    object.__setattr__(plan, "gpipe", True)\n    return plan.schedule == "zb-v"\n')
    assert [h.split(" ")[1] for h in _names_written(probe)] == ["'zb-v'"]


# a variant's field -> the registry module allowed to compare it; a preset's name, by the object that holds it
COMPARED_FIELDS = {"fusion": CORE / "specs" / "fusion.py", "tensor_layout": CORE / "specs" / "layouts.py",
                   "fsdp": CORE / "specs" / "fsdp_modes.py", "cross_entropy": CORE / "specs" / "stack_variants.py",
                   "optimizer_wrapper": CORE / "specs" / "stack_variants.py",
                   **{f: CORE / "serve" / "engine.py" for f in ENGINE_CHOICES},
                   "projections": CORE / "specs" / "stack_variants.py",
                   "expert_gemm": CORE / "specs" / "stack_variants.py",
                   "fp8_scaling": CORE / "specs" / "stack_variants.py",
                   **{f: CORE / "specs" / "stack_variants.py" for f in stack_variants.STACK_CHOICES}}
NAMED_PRESETS = ("stack", "engine")


def _is_text(node: ast.expr) -> bool:
    """A string constant, or a literal tuple / list / set of them."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return bool(node.elts) and all(_is_text(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _variant_compared(node: ast.expr, path: Path) -> str | None:
    """The variant a side of a comparison names (``x.fusion``, ``values["tensor_layout"]``, ``stack.name``,
    ``e.engine.name``), unless ``path`` is its registry."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in COMPARED_FIELDS:
        return node.slice.value if COMPARED_FIELDS[node.slice.value] != path else None
    if not isinstance(node, ast.Attribute):
        return None
    if COMPARED_FIELDS.get(node.attr, path) != path:
        return node.attr
    holder = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
    return f"{holder}.name" if node.attr == "name" and holder in NAMED_PRESETS else None


def _names_compared(path: Path) -> list[str]:
    """``file:line code`` of each comparison in ``path`` of a variant's field or preset name with a string."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_text(s) for s in sides) and any(_variant_compared(s, path) for s in sides):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_variant_name_is_compared_outside_its_registry():
    found = [hit for p in sorted(CORE.rglob("*.py")) for hit in _names_compared(p)]
    assert not found, "a variant's name compared outside its registry (read its record):\n" + "\n".join(found)


def test_the_comparison_check_sees_a_comparison(tmp_path):
    # not vacuous: each form is seen in a module, and the registry's own file may compare its names
    probe = tmp_path / "probe.py"
    probe.write_text('def f(stack, e):\n    a = stack.fusion == "fused"\n    b = e.engine.name in ("vllm", "sglang")\n'
                     '    c = "megatron" != stack.name\n    d = stack.fusion_mode.fused and stack.fusion in NAMES\n'
                     '    g = values["tensor_layout"] != "summa" or e.plan.tensor_layout in ("summa", "tp2d")\n'
                     '    return a, b, c, d, g, e.engine.name == other, values["recompute"] == "full"\n')
    assert [h.split(" ")[0] for h in _names_compared(probe)] == ["probe.py:2", "probe.py:3", "probe.py:4",
                                                                 "probe.py:6", "probe.py:6"]
    registry = CORE / "specs" / "fusion.py"
    registry_probe = tmp_path / "fusion.py"
    registry_probe.write_text('def f(stack):\n    return stack.fusion == "fused"\n')
    assert _names_compared(registry_probe) and not _names_compared(registry)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(COMPARED_FIELDS, "fusion", registry_probe)
        assert _names_compared(registry_probe) == []


def test_one_record_per_fusion_says_what_differs():
    assert fusion.FUSION_NAMES == ("fused", "eager", "jit", "eager-te", "fused-eager-act", "eager-apex")  # choices
    assert [f.name for f in fusion.FUSIONS.values() if f.fused] == ["fused", "fused-eager-act"]
    assert [f.name for f in fusion.FUSIONS.values() if f.counted] == ["eager", "jit", "eager-te", "eager-apex"]
    assert all(f.counted != f.fused for f in fusion.FUSIONS.values())
    assert [f.name for f in fusion.FUSIONS.values() if f.per_op] == ["eager", "eager-te", "eager-apex"]
    assert [f.name for f in fusion.FUSIONS.values() if f.library_norm] == ["eager-te", "eager-apex"]
    assert [f.name for f in fusion.FUSIONS.values() if f.norm_upcast or f.rope != "rope"] == ["eager-apex"]
    assert [f.name for f in fusion.FUSIONS.values() if f.expert_bias_loop] == ["eager-te"]  # AutoModel's _apply_bias
    assert [f.name for f in fusion.FUSIONS.values() if f.jit] == ["jit"]
    assert [f.name for f in fusion.FUSIONS.values() if f.eager_activation] == ["fused-eager-act"]
    assert fusion.hybrid_names() == ("fused",)
    assert load_stack("megatron-deepspeed").fusion_mode is fusion.fusion_of("jit")
    with pytest.raises(KeyError, match="is none of fused, eager, jit, eager-te, fused-eager-act, eager-apex"):
        fusion.fusion_of("compiled")


def test_one_record_per_layout_says_what_differs():
    assert layouts.LAYOUT_NAMES == ("1d", "summa", "tp2d") == LAYOUTS  # Plan.tensor_layout's choices
    assert layouts.names_where(grid=True) == ("summa", "tp2d") and layouts.names_where(in_frameworks=True) == ("1d",)
    assert layouts.names_where(heads_over_tp=False) == ("tp2d",)  # its tp splits h only
    assert layouts.names_where(rows_split=True) == layouts.names_where(panels=True) == ("summa",)
    assert Plan(tp=4).sequence_parallel and not Plan(tp=4, tp2=2, tensor_layout="summa").sequence_parallel
    # 4 x 2: summa's cell and tp2d's "w" (weight-stationary) cell, as the report's legend (report/terms.py) reads them
    assert [layouts.layout_of(n).cell.format(tp=4, tp2=2) for n in layouts.LAYOUT_NAMES] == ["4", "4x2", "4x2w"]
    assert Plan(tp=4, tp2=2, tensor_layout="tp2d").describe().startswith("dp=1 tp2d=4x2 pp=1")
    with pytest.raises(KeyError, match="is none of 1d, summa, tp2d"):
        layouts.layout_of("3d")


def test_one_record_per_fsdp_mode_says_what_differs():
    assert fsdp_modes.FSDP_NAMES == ("none", "fsdp1", "fsdp2")  # Stack.fsdp's choices
    assert [m.name for m in fsdp_modes.FSDP_MODES.values() if m.shards] == ["fsdp1", "fsdp2"]
    assert [m.name for m in fsdp_modes.FSDP_MODES.values() if m.flat] == ["fsdp1"]  # FlatParameter: one tensor a unit
    # FSDP's strategies: NO_SHARD (0), SHARD_GRAD_OP (2), FULL_SHARD (3); no ZeRO-1
    assert [z for z in range(4) if z not in fsdp_modes.fsdp_of("fsdp2").lacks_zero] == [0, 2, 3]
    assert load_stack("torchtitan").fsdp_mode is fsdp_modes.fsdp_of("fsdp2")
    with pytest.raises(KeyError, match="is none of none, fsdp1, fsdp2"):
        fsdp_modes.fsdp_of("zero3")


def test_one_record_per_cross_entropy_says_what_differs():
    losses = stack_variants.LOSSES.values()
    assert stack_variants.LOSS_NAMES == ("fused", "pytorch", "flash", "fused_grad", "vocab_parallel_eager",
                                         "gathered_bf16")
    assert [lo.name for lo in losses if lo.eager] == ["pytorch"]  # F.cross_entropy in eager autograd
    assert [lo.name for lo in losses if lo.gathered] == ["gathered_bf16"]  # the whole vocabulary on every TP rank
    # bytes per logit forward: 2 + 2 x 4 = 10 (16-bit in, fp32 softmax out), flash 2 x 2 = 4, llm.c 3 x 2 = 6,
    # Megatron-DeepSpeed's eager ops 6 + 4 + 8 + 8 + 4 + 8 = 38, bf16 log_softmax 3 x 2 + 2 = 8
    assert [lo.fwd_bytes for lo in losses] == [10, 10, 4, 6, 38, 8]
    assert [lo.name for lo in losses if not lo.bwd_bytes] == ["fused_grad"]  # its forward wrote the gradient
    assert [lo.grad_bytes for lo in losses] == [2, 8, 2, 0, 2, 4]
    assert load_stack("megatron-deepspeed").loss.fwd_kernels == 6.0 and load_stack("torchtitan").loss.eager
    with pytest.raises(KeyError, match="is none of fused, pytorch, flash"):
        stack_variants.cross_entropy_of("liger")


def test_one_record_per_optimizer_wrapper_says_what_differs():
    wrappers = stack_variants.WRAPPERS.values()
    assert stack_variants.WRAPPER_NAMES == ("stated", "deepspeed", "deepspeed-pipeline")
    assert [w.name for w in wrappers if w.per_plan] == ["deepspeed", "deepspeed-pipeline"]
    assert [w.name for w in wrappers if w.pipeline_engine] == ["deepspeed-pipeline"]
    assert load_stack("megatron-deepspeed").wrapper.pipeline_engine and not load_stack("generic").wrapper.per_plan
    with pytest.raises(KeyError, match="is none of stated, deepspeed"):
        stack_variants.wrapper_of("apex")


def test_one_record_per_projections_says_what_differs():
    modes = stack_variants.PROJECTION_MODES.values()
    assert stack_variants.PROJECTION_NAMES == ("fused", "split", "separate")
    assert [p.name for p in modes if p.separate] == ["separate"]  # q_proj, k_proj, v_proj: a GEMM and a tensor each
    assert [p.name for p in modes if p.concat_grads] == ["split"]  # torch.split's backward concatenates
    assert [p.name for p in modes if p.on_grids] == ["fused"]  # the 2D layouts' only projections
    assert load_stack("torchtitan").projection_mode.separate
    with pytest.raises(KeyError, match="is none of fused, split, separate"):
        stack_variants.projections_of("packed")


def test_one_record_per_expert_gemm_and_fp8_scaling_says_what_differs():
    assert stack_variants.EXPERT_GEMM_NAMES == ("per_expert", "grouped")
    assert [g.name for g in stack_variants.EXPERT_GEMMS.values() if g.grouped] == ["grouped"]
    assert stack_variants.FP8_SCALING_NAMES == ("delayed", "current")  # the first is Stack's default
    assert [s.name for s in stack_variants.FP8_SCALINGS.values() if s.current] == ["current"]
    assert not load_stack("generic").fp8_scaling_mode.current and not load_stack("generic").expert_gemm_mode.grouped
    with pytest.raises(KeyError, match="is none of per_expert, grouped"):
        stack_variants.expert_gemm_of("batched")
    with pytest.raises(KeyError, match="is none of delayed, current"):
        stack_variants.fp8_scaling_of("tensorwise")


def test_one_record_per_smaller_choice_says_what_differs():
    choices = stack_variants.STACK_CHOICES
    assert {f: tuple(c) for f, c in choices.items()} == {
        "attention_kernel": ("fused", "fa2", "fp8"), "cp_comm": ("ring", "allgather"),
        "moe_permute": ("fused", "gather_scatter", "sort_gather"), "moe_dispatcher": ("alltoall", "allgather", "flex"),
        "flex_backend": ("deepep", "hybridep", "hybridep-32sm"),
        "pipeline_runtime": ("megatron", "torch", "torch-reduce-after", "megatron-2021-01")}
    flagged = {f: [(r.name, k) for r in c.values() for k in r.__slots__ if k != "name" and getattr(r, k)]
               for f, c in choices.items() if f != "flex_backend"}  # the backends: each a table (test_dispatch.py)
    assert flagged == {"attention_kernel": [("fp8", "fp8")], "cp_comm": [("ring", "ring")],
                       "moe_permute": [("fused", "fused"), ("sort_gather", "fp32_unpermute")],
                       "moe_dispatcher": [("allgather", "gathers_tokens"), ("flex", "forwards")],
                       "pipeline_runtime": [("torch", "keeps_microbatches"), ("torch", "fsdp_nosync"),
                                            ("torch-reduce-after", "fsdp_nosync"),
                                            ("torch-reduce-after", "reduces_after"),
                                            ("megatron-2021-01", "sends_whole")]}
    assert load_stack("torchtitan").pipeline_runtime_mode.keeps_microbatches
    with pytest.raises(KeyError, match="cp_comm 'ulysses' is none of ring, allgather"):
        stack_variants.choice_of("cp_comm", "ulysses")


def test_one_record_per_engine_variant_says_what_differs():
    assert {f: tuple(c) for f, c in ENGINE_CHOICES.items()} == {
        "prefill": ("chunked", "separate", "whole"), "kv_reservation": ("on_demand", "full"),
        "moe_comm": ("all_to_all", "all_gather", "deepep"), "kv_overflow": ("recompute", "queue", "refuse",
                                                                       "recompute_kept"),
        "memory_basis": ("total", "free")}
    # each field's default is its first variant
    assert all(next(iter(ENGINE_CHOICES[f])) == getattr(Engine(), f) for f in ENGINE_CHOICES)
    flagged = {f: [(r.name, k) for r in c.values() for k in r.__slots__ if k != "name" and getattr(r, k)]
               for f, c in ENGINE_CHOICES.items()}
    assert flagged == {"prefill": [("chunked", "chunked"), ("chunked", "mixed"), ("whole", "mixed"),
                                   ("whole", "bounded")],
                       "kv_reservation": [("full", "whole")],
                       "moe_comm": [("all_gather", "gather"), ("deepep", "forwarded")],
                       "kv_overflow": [("recompute", "preempts"), ("queue", "queues"), ("refuse", "refuses"),
                                       ("recompute_kept", "preempts"), ("recompute_kept", "keeps")],
                       "memory_basis": [("total", "of_total")]}
    assert Engine(prefill="separate").mode("prefill") is ENGINE_CHOICES["prefill"]["separate"]


def test_one_record_per_schedule_in_its_family():
    assert tuple(REGISTRY) == ALL == (*SYNC, *ASYNC, *SPLIT)
    assert sorted(SEARCH_ORDER) == sorted(ALL)
    assert {s.name for s in REGISTRY.values() if not s.flushes} == set(ASYNC)
    assert {s.name for s in REGISTRY.values() if s.split} == set(SPLIT)
    assert [s.name for s in REGISTRY.values() if s.weight_copies == 2] == ["dualpipe"]  # DeepSeek-V3 Table 2: 2x
    assert [s.name for s in REGISTRY.values() if s.mirrored] == ["chimera"]
    assert [s.name for s in REGISTRY.values() if not s.head_last] == ["zb-v"]
    with pytest.raises(KeyError, match="is none of"):
        schedule_of("zb-h2")


def test_the_split_schedules_name_their_report_table_builder():
    # the records name their builders (timelines.BUILDERS), so that the tables load only when a report draws them;
    # tables.build draws the others
    from meshplan.pipeline.timelines import BUILDERS
    assert [s.name for s in REGISTRY.values() if s.timeline] == list(SPLIT)
    assert sorted(s.timeline for s in REGISTRY.values() if s.timeline) == sorted(BUILDERS)


def test_refusals_say_why():
    assert schedule_of("1f1b").refusals(4, 1, 8) == []
    assert "needs schedule='interleaved'" in schedule_of("1f1b").refusals(4, 2, 8)[0]
    assert "does not divide the 6 micro-batches" in schedule_of("interleaved").refusals(4, 2, 6)[0]
    assert "m >= pp" in schedule_of("pipedream-2bw").refusals(4, 1, 2)[0]
    assert "m >= 2*pp" in schedule_of("zb-v").refusals(4, 2, 6)[0]
    assert "even stages" in schedule_of("zb-v").refusals(4, 2, 8, (3, 0))[0]
    assert "DualPipe's own check" in schedule_of("dualpipe").refusals(4, 1, 6)[0]
    assert schedule_of("dualpipe").refusals(4, 1, None) == []  # m unknown: the batch check says it


def test_every_rank_runs_the_embedding_and_the_head_once_in_all():
    for record in REGISTRY.values():
        for pp in (2, 4, 8):
            shares = [record.end_shares(pp, r) for r in range(pp)]
            assert sum(e for e, _ in shares) == sum(h for _, h in shares) == 1.0, record.name


MODEL = load_model("llama3-8b")
CLUSTER = load_system("h100").cluster(64)
ANY = load_stack("any")


@pytest.mark.parametrize(("schedule", "vpp", "batch"), [("chimera", 1, 8), ("zb-v", 2, 32), ("zb-h1", 1, 32),
                                                        ("1f1b", 1, 32), ("gpipe", 1, 32), ("interleaved", 2, 32)])
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_the_same_plan_prices_the_same_with_its_default_settings_written_out(schedule, vpp, batch, mode):
    """Issue 82: a plan with ``stage_recompute`` naming its own recompute on every rank goes down the per-rank path
    (step/ranks.py); it must price the plan as the end ranks' path does. Before the fix a Chimera plan's per-rank
    bubble was 1F1B's over the forwards (0.043 s against 0.262 s at m = 32) and ZB-V's head sat on the last rank."""
    plan = Plan(dp=2, tp=8, pp=4, vpp=vpp, global_batch=batch, schedule=schedule, recompute=mode)
    even = estimate(MODEL, CLUSTER, plan, ANY)
    apart = estimate(MODEL, CLUSTER, plan.with_(stage_recompute=(mode,) * 4), ANY)
    assert apart.step_time == pytest.approx(even.step_time, rel=1e-9)
    assert apart.breakdown["bubble"] == pytest.approx(even.breakdown["bubble"], rel=1e-9)
    assert apart.peak_memory == pytest.approx(even.peak_memory, rel=1e-9)
