"""The distributed optimizer's weight all-gather (Stack.overlap_param_gather) through Megatron-LM's arguments and
Megatron-Bridge's overrides: written where the framework takes it, read back as the framework reads it, and the same
stack after emit -> read.

- Megatron-LM: ``--overlap-param-gather`` is store_true (off unless given: arguments.py:2683-2684 @ core_v0.17.0), and
  validate_args takes it only with ``--use-distributed-optimizer`` and ``--overlap-grad-reduce`` (856-861). Its own
  parse_args / validate_args (tests/megatron_lm_check.py) take every script written here, and the reader gives the
  value Megatron-LM parsed from the arguments alone (the ``meshplan:`` comment dropped).
- Megatron-Bridge: DistributedDataParallelConfig.overlap_param_gather defaults to False; a recipe's CommOverlapConfig
  turns both data-parallel overlaps on under the distributed optimizer with dp > 1 unless comm_overlap.* says
  otherwise (training/comm_overlap.py:527-546, 557-565, 597-606 @ 0.3.1). Its CommOverlapConfig.setup runs here on the
  written overrides (Megatron-Bridge cannot be imported without Transformer Engine; comm_overlap.py itself needs only
  Megatron-Core's config classes, with the model providers, used there as type hints, stood in for).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import replace

import pytest

from framework_parsers import megatron_arguments, parser_path
from meshplan.configs import emit, read
from meshplan.configs.common import param_gather
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
MODEL = load_model("llama3-8b")
# 16 GPUs: dp 4, so that Megatron-Bridge's CommOverlapConfig acts (dp > 1); interleaved, so that its p2p rule acts too
PLAN = Plan(dp=4, tp=2, pp=2, vpp=2, schedule="interleaved", sequence_parallel=True, micro_batch=1, global_batch=64,
            zero=1)
# (zero, overlap_dp, overlap_param_gather): every combination a stack can hold
COMBOS = [(zero, dp, gather) for zero in (0, 1) for dp in (False, True) for gather in (False, True)]


def _uncommented(text: str) -> str:
    """The file as a user's own would be: no ``meshplan:`` comment."""
    return "\n".join(line for line in text.splitlines() if "meshplan:" not in line) + "\n"


@pytest.mark.parametrize("fmt,preset", [("megatron", "megatron-core"), ("nemo", "megatron-bridge")])
@pytest.mark.parametrize(("zero", "overlap_dp", "gather"), COMBOS)
def test_emit_then_read_gives_the_same_stack_and_the_file_alone_the_frameworks_value(fmt, preset, zero, overlap_dp,
                                                                                     gather):
    plan = PLAN.with_(zero=zero)
    stack = load_stack(preset).with_(overlap_dp=overlap_dp, overlap_param_gather=gather)
    text = emit(fmt, MODEL, plan, stack)
    assert read(fmt, MODEL, 16, text=text) == (plan, stack)
    # without the comment: on only where the flag is written, which needs the distributed optimizer and overlap_dp
    alone = read(fmt, MODEL, 16, text=_uncommented(text))[1]
    assert alone.overlap_param_gather is (zero == 1 and overlap_dp and gather)
    assert ("stack.overlap_param_gather" in text) is (alone.overlap_param_gather != gather)


def test_a_user_s_megatron_arguments_without_the_flag_price_a_synchronous_gather():
    """Megatron-LM's default: the gather runs after the optimizer step and the first forward pass waits for it, so the
    step is longer than with the flag given (test_param_gather.py: the whole gather leads the first forward)."""
    stack = load_stack("megatron-core").with_(overlap_dp=True, overlap_param_gather=True)
    text = _uncommented(emit("megatron", MODEL, PLAN, stack))
    assert "  --overlap-param-gather\n" in text and "  --overlap-grad-reduce\n" in text
    plan, on = read("megatron", MODEL, 16, text=text)
    _, off = read("megatron", MODEL, 16, text=text.replace("  --overlap-param-gather\n", ""))
    assert on == stack and off == stack.with_(overlap_param_gather=False)
    cluster = load_system("h100").cluster(16)
    assert estimate(MODEL, cluster, plan, off).step_time > estimate(MODEL, cluster, plan, on).step_time
    # the megatron-core preset is Megatron-LM's defaults: both flags off
    assert not load_stack("megatron-core").overlap_param_gather


def test_megatron_lm_parses_every_script_as_the_reader_reads_it(tmp_path, megatron):
    cases, expected = [], []
    for zero, overlap_dp, gather in COMBOS:
        plan = PLAN.with_(zero=zero)
        stack = load_stack("megatron-core").with_(overlap_dp=overlap_dp, overlap_param_gather=gather)
        script = tmp_path / f"z{zero}-dp{overlap_dp:d}-g{gather:d}.sh"
        script.write_text(_uncommented(emit("megatron", MODEL, plan, stack)))
        argv, env = megatron_arguments(script, "--mock-data")
        cases.append({"argv": argv, "env": env, "world_size": 16, "capability": [9, 0], "label": script.stem})
        back = read("megatron", MODEL, 16, text=script.read_text())[1]
        expected.append([back.overlap_dp, back.overlap_param_gather, back.overlap_pp])
        assert back.overlap_param_gather is param_gather(stack, plan)
    got = megatron(cases)  # Megatron-LM's child of this test process (conftest.py)
    assert all(v["ok"] for v in got), [(c["label"], v.get("error")) for c, v in zip(cases, got, strict=True)]
    assert [v["overlaps"] for v in got] == expected


def _comm_overlap_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Megatron-Bridge 0.3.1's training/comm_overlap.py, loaded from its source (module docstring), its two package
    stand-ins in sys.modules for this test only."""
    path = parser_path("megatron-bridge") / "megatron" / "bridge" / "training" / "comm_overlap.py"
    providers = types.ModuleType("megatron.bridge.models")
    providers.GPTModelProvider = providers.T5ModelProvider = object  # type: ignore[attr-defined]
    stand_ins = {"megatron.bridge": types.ModuleType("megatron.bridge"), "megatron.bridge.models": providers}
    for name, module in stand_ins.items():
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("bridge_comm_overlap", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bridge_runs(text: str, comm_overlap: types.ModuleType, dp: int) -> tuple[object, object, object]:
    """What Megatron-Bridge's ConfigContainer holds after the overrides of ``text`` and its comm-overlap setup
    (training/config.py:1866-1872 @ 0.3.1: set_data_parallel_size, CommOverlapConfig.finalize and setup), from the
    performance recipes' settings: the DDP config of recipes/common.py (both overlaps on, the distributed optimizer)
    and a CommOverlapConfig with TP overlap (recipes/llama/llama3.py)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    ddp = DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather=True,
                                        use_distributed_optimizer=True)
    optimizer = OptimizerConfig(use_distributed_optimizer=True)
    overlap = comm_overlap.CommOverlapConfig(tp_comm_overlap=True)
    model = types.SimpleNamespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                  virtual_pipeline_model_parallel_size=None, sequence_parallel=False,
                                  overlap_p2p_comm=False, batch_p2p_comm=True, tp_comm_overlap=False,
                                  overlap_moe_expert_parallel_comm=False)
    sections = {"ddp": ddp, "optimizer": optimizer, "comm_overlap": overlap, "model": model}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        section, _, name = key.partition(".")
        if line.startswith("#") or not eq or section not in sections or not hasattr(sections[section], name):
            continue
        setattr(sections[section], name, {"true": True, "false": False}.get(value, int(value) if value.isdigit()
                                                                             else value))
    overlap.data_parallel_size = dp
    overlap.finalize()
    overlap.setup(model, optimizer, ddp)
    return ddp, optimizer, model


def test_megatron_bridge_runs_the_overlaps_as_written(monkeypatch):
    comm_overlap = _comm_overlap_module(monkeypatch)
    bridge = load_stack("megatron-bridge")
    for zero, overlap_dp, gather in COMBOS:
        plan, stack = PLAN.with_(zero=zero), bridge.with_(overlap_dp=overlap_dp, overlap_param_gather=gather)
        text = emit("nemo", MODEL, plan, stack)
        ddp, optimizer, _ = _bridge_runs(text, comm_overlap, plan.dp)
        label = (zero, overlap_dp, gather)
        assert ddp.use_distributed_optimizer is (zero == 1), label
        if zero == 1:  # without the distributed optimizer the ddp.* written stand: CommOverlapConfig leaves them
            assert ddp.overlap_grad_reduce is overlap_dp, label
        assert ddp.overlap_param_gather is optimizer.overlap_param_gather is param_gather(stack, plan), label
        assert read("nemo", MODEL, 16, text=_uncommented(text))[1].overlap_param_gather is ddp.overlap_param_gather
    for overlap_pp in (False, True):  # interleaved, CommOverlapConfig sets overlap_p2p_comm (comm_overlap.py:450-460)
        text = _uncommented(emit("nemo", MODEL, PLAN, bridge.with_(overlap_pp=overlap_pp)))
        assert _bridge_runs(text, comm_overlap, PLAN.dp)[2].overlap_p2p_comm is overlap_pp
        assert read("nemo", MODEL, 16, text=text)[1].overlap_pp is overlap_pp
    # the check can fail: the overrides written before (ddp.* alone) leave the recipe's CommOverlapConfig to turn the
    # gather back on over ddp.overlap_param_gather=false, at dp 4 with the distributed optimizer
    stack = bridge.with_(overlap_param_gather=False)
    old = "\n".join(line for line in emit("nemo", MODEL, PLAN, stack).splitlines()
                    if not line.startswith(("comm_overlap.overlap_", "optimizer.overlap_param_gather")))
    assert "ddp.overlap_param_gather=false" in old
    assert _bridge_runs(old, comm_overlap, PLAN.dp)[0].overlap_param_gather is True


def test_the_nemo_reader_takes_comm_overlap_over_ddp_under_the_distributed_optimizer():
    base = _uncommented(emit("nemo", MODEL, PLAN, load_stack("megatron-bridge")))
    lines = [line for line in base.splitlines() if not line.startswith("comm_overlap.overlap_")]
    ddp_only = "\n".join(lines) + "\n"
    assert read("nemo", MODEL, 16, text=ddp_only)[1].overlap_param_gather  # ddp.overlap_param_gather=true
    said = ddp_only + "comm_overlap.overlap_param_gather=false\n"
    assert not read("nemo", MODEL, 16, text=said)[1].overlap_param_gather
    # without the distributed optimizer CommOverlapConfig leaves ddp.* alone (comm_overlap.py:597-606)
    plain = replace(PLAN, zero=0)
    text = _uncommented(emit("nemo", MODEL, plain, load_stack("megatron-bridge").with_(overlap_dp=False)))
    assert "ddp.overlap_grad_reduce=false" in text
    flipped = text.replace("comm_overlap.overlap_grad_reduce=false", "comm_overlap.overlap_grad_reduce=true")
    assert not read("nemo", MODEL, 16, text=flipped)[1].overlap_dp


# the stack fields of the last sessions that no framework option says: dglu_slowdown is a kernel release's regression
# (cudnn-frontend's grouped dGLU: recipes_off.DGLU_SLOWDOWN), drained_passes the training loop's own host
# synchronisations, gathered_ends / expandable_segments FSDP2's and the allocator's (an environment variable, not a
# config key); each rides the meshplan: comment, in every format
CARRIED = [{"drained_passes": d} for d in ("forward", "both", "layers")] + [
    {"dglu_slowdown": 1.5, "expert_gemm": "grouped"}, {"gathered_ends": True}, {"expandable_segments": True},
    {"overlap_param_gather": False}]
FORMAT_PLANS = {  # a plan each format writes: (preset, plan)
    "megatron": ("megatron-core", PLAN), "nemo": ("megatron-bridge", PLAN),
    "torchtitan": ("torchtitan", Plan(dp=8, tp=2, sequence_parallel=True, global_batch=64, zero=3,
                                      recompute="none", recompute_modules=())),
    "deepspeed": ("deepspeed", Plan(dp=16, global_batch=64, zero=2, recompute="none", recompute_modules=()))}


@pytest.mark.parametrize("fmt", sorted(FORMAT_PLANS))
def test_the_stack_fields_no_option_says_ride_the_comment(fmt):
    preset, plan = FORMAT_PLANS[fmt]
    model = load_model("qwen3-30b-a3b") if fmt in ("megatron", "nemo") else MODEL
    plan = plan.with_(ep=2, etp=1) if model.is_moe else plan
    for fields in CARRIED:
        stack = load_stack(preset).with_(**fields)
        text = emit(fmt, model, plan, stack)
        assert read(fmt, model, 16, text=text)[1] == stack, (fmt, fields)
