"""Plan.optimizer: the optimizer state per parameter (memory.OPTIMIZER_STATE), the optimizer step's memory-bound
traffic (channels.optimizer_time), the command line (estimate --optimizer, plan --optimizer as a fixed setting) and
the framework configs (emit writes it where the format has the option, read gives it back, the rest is refused)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan.cli.main import main
from meshplan.configs import emit, read
from meshplan.cost.params import StageParams
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.memory import OPTIMIZER_STATE, model_states, per_parameter_byte
from meshplan.search import Space, search
from meshplan.specs.check import check
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import OPTIMIZERS, Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import optimizer_time

# Megatron-Core warns that Transformer Engine and Apex are missing (it falls back to PyTorch: nothing the configs use)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
EIGHT_B = StageParams(dense=8e9, expert=0.0)


def test_every_choice_has_its_state():
    assert set(OPTIMIZERS) == set(OPTIMIZER_STATE) and Plan().optimizer == "adam"
    state = {name: kind.state for name, kind in OPTIMIZER_STATE.items()}
    assert state == {"adam": 12, "adamw": 12,  # 4 master + 4 m + 4 v (ZeRO §3.1, K = 12)
                     "adam-bf16": 8,  # 4 + 2 + 2
                     "adam-8bit": 6.03125,  # 4 + 1 + 1 + 2 scales x 4 bytes / 256 elements
                     "sgd-momentum": 8, "sgd": 4, "adafactor": 4}


@pytest.mark.parametrize(("name", "torch_optim", "mixed_bf16"), [
    # torch.optim in place at fp32 (state K - 4; traffic r + 2K/4) | mixed precision on bf16 (K/2; (2r + 2K + 2)/2)
    ("adam", (2.0, 7.0), (6.0, 14.0)),  # exp_avg, exp_avg_sq; read g, p, m, v, write p, m, v | 2 + 24 + 2 = 28
    ("sgd-momentum", (1.0, 5.0), (4.0, 10.0)),  # the momentum buffer; read g, p, b, write p, b | 2 + 16 + 2 = 20
    ("sgd", (0.0, 3.0), (2.0, 6.0)),  # read g, p, write p | 2 + 8 + 2 = 12
    ("adafactor", (0.0, 4.0), (2.0, 7.0)),  # the gradient read twice | 4 + 8 + 2 = 14
])
def test_traced_engines_derive_state_and_traffic_from_the_table(name, torch_optim, mixed_bf16):
    """trace, the sharding planner and check-step price the optimizer per parameter byte from OPTIMIZER_STATE
    (memory.per_parameter_byte); the mixed-precision traffic is channels.optimizer_time's r·g + 2K + 2 over 2."""
    assert per_parameter_byte(name, 4, master=False) == torch_optim
    assert per_parameter_byte(name, 2, master=True) == mixed_bf16
    assert mixed_bf16[1] == OPTIMIZER_STATE[name].step_bytes(2) / 2


@pytest.mark.parametrize(("name", "gigabytes"), [("adam", 12.0), ("adam-bf16", 8.0), ("adam-8bit", 6.03125),
                                                 ("sgd-momentum", 8.0), ("sgd", 4.0), ("adafactor", 4.0)])
def test_optimizer_bytes_per_gpu_under_zero_1(name, gigabytes):
    """8B parameters, ZeRO-1 over dp 8: Adam 12 x 8e9 / 8 = 12 GB a GPU; bf16 moments 8 x 8e9 / 8 = 8 GB; the weights
    (2 x 8e9 = 16 GB) and the fp32 gradients (4 x 8e9 = 32 GB) stay whole."""
    plan = Plan(dp=8, zero=1, grad_bytes=4, optimizer=name)
    weights, grads, optimizer = model_states(EIGHT_B, plan, load_stack("megatron-core"))
    assert (weights, grads) == (16e9, 32e9)
    assert optimizer == pytest.approx(gigabytes * 1e9)


def test_zero_3_and_offload_shard_and_move_the_chosen_state():
    stack = load_stack("megatron-core")
    # ZeRO-3 over 8: 2/8 + 2/8 + 8/8 bytes a parameter with bf16 moments: (2 + 2 + 8) x 8e9 / 8 = 12 GB
    states = model_states(EIGHT_B, Plan(dp=8, zero=3, grad_bytes=2, optimizer="adam-bf16"), stack)
    assert sum(states) == pytest.approx(12e9)
    # offloaded: nothing of the state on the GPU, whatever the optimizer
    assert model_states(EIGHT_B, Plan(dp=8, zero=1, offload_optimizer=True, optimizer="sgd"), stack)[2] == 0.0


def test_optimizer_step_streams_its_bytes():
    """(r·g + 2K + 2) bytes a parameter of the GPU's shard at the HBM rate: Adam with fp32 gradients (4 + 24 + 2) = 30,
    bf16 moments (4 + 16 + 2) = 22, SGD (4 + 8 + 2) = 14, Adafactor reads the gradient twice (8 + 8 + 2) = 18."""
    cluster, eff = load_system("h100").cluster(8), Efficiency()
    rate = cluster.accelerator.hbm_bandwidth * eff.memory
    shard = 8e9 / 8
    for name, moved in (("adam", 30), ("adamw", 30), ("adam-bf16", 22), ("sgd-momentum", 22), ("sgd", 14),
                        ("adafactor", 18), ("adam-8bit", 4 + 2 * 6.03125 + 2)):
        plan = Plan(dp=8, zero=1, grad_bytes=4, optimizer=name)
        assert optimizer_time(cluster, plan, EIGHT_B, eff) == pytest.approx(shard * moved / rate), name
    # offloaded: the same bytes over the host link, (4 + 2 + 16) for bf16 moments
    plan = Plan(dp=8, zero=1, grad_bytes=4, optimizer="adam-bf16", offload_optimizer=True)
    assert optimizer_time(cluster, plan, EIGHT_B, eff) == pytest.approx(shard * 22 / cluster.host_bandwidth)


def _lighter(a: str, b: str) -> bool:
    """``a`` keeps no more state than ``b`` and reads the gradient no more often."""
    x, y = OPTIMIZER_STATE[a], OPTIMIZER_STATE[b]
    return x.state <= y.state and x.grad_reads <= y.grad_reads


@pytest.mark.parametrize(("name", "plan"), [
    ("llama3-8b", Plan(dp=8, zero=1, micro_batch=1, global_batch=64, grad_bytes=4)),
    ("llama3-8b", Plan(dp=2, tp=2, pp=2, zero=0, micro_batch=1, global_batch=32, sequence_parallel=True)),
    ("mixtral-8x7b", Plan(dp=4, ep=4, pp=2, zero=3, micro_batch=1, global_batch=64, grad_bytes=2)),
    ("llama3-8b", Plan(dp=8, zero=2, micro_batch=1, global_batch=64, offload_optimizer=True))])
def test_fewer_optimizer_bytes_never_cost_memory_or_time(name, plan):
    model, cluster, stack = load_model(name), load_system("h100").cluster(plan.num_gpus), load_stack("generic")
    ests = {o: estimate(model, cluster, replace(plan, optimizer=o), stack) for o in OPTIMIZERS}
    for a in OPTIMIZERS:
        for b in OPTIMIZERS:
            if _lighter(a, b):
                assert ests[a].peak_memory <= ests[b].peak_memory, (a, b)
                assert ests[a].step_time <= ests[b].step_time, (a, b)
    assert ests["adam-bf16"].peak_memory < ests["adam"].peak_memory or plan.offload_optimizer
    assert ests["adam"].step_time == ests["adamw"].step_time and ests["adam"].peak_memory == ests["adamw"].peak_memory


def test_the_step_row_names_the_optimizer():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    plan = Plan(dp=8, zero=1, micro_batch=1, global_batch=64)
    rows = {r.name for r in estimate(model, cluster, plan, load_stack("generic")).ops}
    assert "optimizer/adam" in rows
    rows = {r.name for r in estimate(model, cluster, replace(plan, optimizer="sgd"), load_stack("generic")).ops}
    assert "optimizer/sgd" in rows and "optimizer/adam" not in rows


def test_a_bad_optimizer_is_refused():
    assert any("optimizer='lion'" in r for r in check(load_model("llama3-8b"), None, Plan(optimizer="lion")))
    with pytest.raises(SpecError, match="optimizer='lion'"):
        Space(global_batch=64, optimizer="lion")


def test_estimate_takes_the_option_and_the_json_carries_it(capsys):
    base = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--zero", "1", "--json"]
    assert main([*base, "--optimizer", "adam-bf16"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["optimizer"] == "adam-bf16"
    # 8 bytes x 8.03e9 parameters / 8 GPUs
    assert data["memory_bytes"]["optimizer"] == pytest.approx(8 * data["params"] / 8)
    assert main([*base, "--optimizer", "lion"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optimizer" in err[0]


def test_plan_keeps_the_optimizer_fixed(capsys):
    args = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--zero", "1", "--placements",
            "default", "--no-offload", "--max-micro-batch", "2", "--top", "3", "--json"]
    assert main([*args, "--optimizer", "sgd"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and {p["plan"]["optimizer"] for p in plans} == {"sgd"}
    # sgd keeps 4 of Adam's 12 bytes: on one shape (tp, pp, cp, micro-batch and recompute pinned, so the two searches
    # rank the same plans) its best plan holds less memory than Adam's
    args += ["--tp", "2", "--pp", "1", "--cp", "1", "--micro-batch", "1", "--recompute", "selective"]
    assert main([*args, "--optimizer", "sgd"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert main([*args]) == 0
    adam = json.loads(capsys.readouterr().out)["plans"]
    assert {p["plan"]["optimizer"] for p in adam} == {"adam"}
    assert min(p["peak_memory_bytes"] for p in plans) < min(p["peak_memory_bytes"] for p in adam)


def test_search_space_passes_the_optimizer_to_every_plan():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    space = Space(global_batch=64, optimizer="adam-8bit", all_placements=False, stack=load_stack("any"))  # Megatron
    result = search(model, cluster, space, top_k=3, workers=1)  # (Space's default framework) runs no 8-bit Adam
    assert result.plans and all(e.plan.optimizer == "adam-8bit" for e in result.plans)


# what each format writes (the others it refuses in one line)
EXPRESSED = {"megatron": ("adam", "adamw", "adam-bf16", "sgd-momentum", "sgd"),
             "nemo": ("adam", "adamw", "sgd-momentum", "sgd"),
             "deepspeed": ("adam", "adamw", "sgd-momentum", "sgd", "adafactor"),
             "torchtitan": ("adam", "adamw")}
PRESETS = {"megatron": ("megatron-core", 1), "nemo": ("megatron-bridge", 1), "deepspeed": ("deepspeed", 1),
           "torchtitan": ("torchtitan", 3)}


@pytest.mark.parametrize("fmt", sorted(EXPRESSED))
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_emit_then_read_gives_the_optimizer_back_or_refuses(fmt, optimizer):
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    preset, zero = PRESETS[fmt]
    stack = load_stack(preset)
    plan = Plan(dp=8, zero=zero, micro_batch=1, global_batch=64, optimizer=optimizer, recompute="none")
    if optimizer not in EXPRESSED[fmt]:
        with pytest.raises(SpecError, match=f"{fmt} cannot express optimizer={optimizer}"):
            emit(fmt, model, plan, stack)
        return
    text = emit(fmt, model, plan, stack)
    back, back_stack = read(fmt, model, 8, text=text)
    assert back == plan, text
    assert estimate(model, cluster, back, back_stack).step_time == estimate(model, cluster, plan, stack).step_time


def test_megatron_writes_the_precision_aware_optimizer_and_sgd():
    model, stack = load_model("llama3-8b"), load_stack("megatron-core")
    text = emit("megatron", model, Plan(dp=8, zero=1, optimizer="adam-bf16"), stack)
    assert "--use-precision-aware-optimizer" in text and "--exp-avg-dtype bf16" in text
    assert "--exp-avg-sq-dtype bf16" in text
    assert "--optimizer sgd" in emit("megatron", model, Plan(dp=8, zero=1, optimizer="sgd-momentum"), stack)
    assert "--sgd-momentum 0" in emit("megatron", model, Plan(dp=8, zero=1, optimizer="sgd"), stack)
    # Megatron-Core runs the precision-aware optimizer with its distributed optimizer only
    with pytest.raises(SpecError, match="zero=1"):
        emit("megatron", model, Plan(dp=8, zero=0, optimizer="adam-bf16"), stack)
    # fp8 moments: a dtype meshplan does not price
    args = "--tensor-model-parallel-size 1 --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8"
    with pytest.raises(SpecError, match="exp_avg_dtype=fp8/fp8"):
        read("megatron", model, 8, text=args)


def test_the_frameworks_take_the_emitted_optimizer(tmp_path, monkeypatch):
    """DeepSpeed's DeepSpeedConfig reads the optimizer section; torchtitan's ConfigManager the [optimizer] name;
    Megatron-Core's OptimizerConfig the sgd overrides."""
    from deepspeed.runtime import config as ds
    from megatron.core.optimizer import OptimizerConfig

    from test_configs_deepspeed_loader import _DataParallel
    from test_configs_framework_loaders import _overrides, _torchtitan_config_manager

    model = load_model("llama3-8b")
    monkeypatch.setattr(ds.dist, "get_rank", lambda *args, **kwargs: 0)
    plan = Plan(dp=8, zero=1, micro_batch=1, global_batch=64, optimizer="sgd-momentum", recompute="none")
    loaded = ds.DeepSpeedConfig(json.loads(emit("deepspeed", model, plan, load_stack("deepspeed"))),
                                mpu=_DataParallel(8))
    assert (loaded.optimizer_name, loaded.optimizer_params) == ("SGD", {"lr": 1e-3, "momentum": 0.9})
    assert loaded.zero_allow_untested_optimizer
    path = tmp_path / "job.toml"
    path.write_text(emit("torchtitan", model, Plan(dp=8, zero=3, micro_batch=1, global_batch=64, optimizer="adam",
                                                   recompute="none"), load_stack("torchtitan")))
    assert _torchtitan_config_manager()().parse_args(["--job.config_file", str(path)]).optimizer.name == "Adam"
    text = emit("nemo", model, replace(plan, optimizer="sgd"), load_stack("megatron-bridge"))
    config = OptimizerConfig(**_overrides(text)["optimizer"])
    assert (config.optimizer, float(config.sgd_momentum)) == ("sgd", 0.0)  # the helper passes the text, as Hydra would


def test_frameworks_say_which_optimizers_they_run(capsys):
    """Megatron's --optimizer adam|sgd and its precision-aware bf16 moments; torchtitan's Adam / AdamW; DeepSpeed's
    Adam, AdamW and torch.optim classes: the search refuses what the framework cannot launch, --framework any
    prices every optimizer, and the presets that run a plan are named by its optimizer too."""
    from meshplan.specs.stack import frameworks_running

    assert "adam-8bit" not in load_stack("megatron-core").supports.optimizers
    assert load_stack("torchtitan").supports.optimizers == ("adam", "adamw")
    assert set(load_stack("any").supports.optimizers) == set(OPTIMIZERS)
    plan = Plan(dp=8, zero=0, optimizer="adam-bf16")
    assert "optimizer=adam-bf16" in load_stack("torchtitan").supports.problems(plan)
    running = frameworks_running(plan)
    assert "megatron-core" in running and "torchtitan" not in running and "deepspeed" not in running
    args = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--optimizer", "adam-8bit"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == ("meshplan: error: optimizer=adam-8bit: framework megatron-core runs "
                                               "adam, adamw, adam-bf16, sgd-momentum, sgd (--framework any prices "
                                               "every optimizer)")
    assert main([*args, "--framework", "any", "--top", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["plan"]["optimizer"] == "adam-8bit"
