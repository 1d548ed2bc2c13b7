"""The framework's rules in the search (issue 47 item 3): each refusal of specs/refusals.py is checked against the
framework's own code at the cited version (the quoted text at the cited lines of the installed package; where the
check runs on a CPU, the framework's own object built with the plan's settings raises), and the searches of the
Megatron-Core, torchtitan and DeepSpeed presets rank no plan their framework refuses: each ranked plan's settings
build Megatron-Core's own TransformerConfig, and the refused plans are tallied with the refusal's reason."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from meshplan.search import Space, search
from meshplan.specs.fsdp_modes import fsdp_of
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.refusals import REFUSALS, fsdp_stages
from meshplan.specs.stack import load_stack

MCORE = load_stack("megatron-core")


def _site_file(package: str, path: str) -> Path:
    """A file of the installed distribution, found by its metadata (without importing it: a test module may have
    put a stand-in of the package into sys.modules)."""
    return Path(str(importlib.metadata.distribution(package).locate_file(path)))


def _source_lines(package: tuple[str, str], path: str) -> list[str]:
    """The cited file's lines: of the installed distribution, or of Megatron-LM's megatron/training, which the
    megatron-core 0.17.0 wheel ships and .ci/parsers.py unpacks (tests/framework_parsers.py)."""
    if package[0] == "megatron-lm":
        from framework_parsers import parser_path

        root = parser_path("megatron-lm")
        assert (root / "VERSION").read_text().strip() == "megatron-core==" + package[1].removeprefix("core_v")
        return (root / path).read_text().splitlines()
    assert importlib.metadata.version(package[0]) == package[1]
    return _site_file(package[0], path).read_text().splitlines()


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_each_refusal_quotes_the_installed_framework_at_the_cited_lines(name):
    rule = REFUSALS[name]
    lines = _source_lines(rule.package, rule.path)
    first, last = rule.lines
    assert rule.quote in "\n".join(lines[first - 1:last]), f"{rule.source} no longer says {rule.quote!r}"


def test_fsdps_own_rule_quotes_the_installed_torch():
    # the search's statement of FSDP's ZeRO stages (refusals.fsdp_stages, check's reason) cites torch's strategies
    rule = fsdp_stages(fsdp_of("fsdp2"))
    assert importlib.metadata.version("torch").split("+")[0] == rule.package[1]
    lines = _site_file("torch", rule.path).read_text().splitlines()
    assert rule.quote in "\n".join(lines[rule.lines[0] - 1:rule.lines[1]])
    assert all(f"{name} = auto()" in "\n".join(lines[rule.lines[0] - 1:rule.lines[1]])
               for name in ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"))


def _transformer_config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "pipeline_dtype": torch.bfloat16,
            "bf16": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(**base | kw)


TINY = replace(load_model("llama3-8b"), num_layers=4)
TINY_MOE = load_model("gpt-oss-20b")  # MoE with linear biases
OFFLOAD = {"cpu_offloading": True, "cpu_offloading_num_layers": 1}
# (refusal, the model, the plan it refuses, TransformerConfig's arguments for that plan, the error, the same plan
# with the refused setting changed, and its arguments: these build)
MEGATRON_CASES = [
    ("offload_with_pp", TINY, {"pp": 2, "dp": 1, "offload_activations": True, "offload_layers": 1},
     {"pipeline_model_parallel_size": 2, **OFFLOAD}, "Pipeline parallelism with CPU offloading",
     {"pp": 1}, OFFLOAD),
    ("offload_with_recompute", TINY, {"offload_activations": True, "offload_layers": 1, "recompute": "selective"},
     {"recompute_granularity": "selective", **OFFLOAD}, "activation recomputation is enabled",
     {"recompute": "none"}, OFFLOAD),
    ("offload_every_layer", TINY, {"offload_activations": True},
     {"cpu_offloading": True, "cpu_offloading_num_layers": 4}, "only for layers less than 4",
     {"offload_layers": 3}, {"cpu_offloading": True, "cpu_offloading_num_layers": 3}),
    ("moe_bias_with_etp", TINY_MOE, {"tp": 2, "dp": 1, "etp": 2, "sequence_parallel": True},
     {"num_moe_experts": 4, "tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 2,
      "sequence_parallel": True, "add_bias_linear": True}, "Bias in Moe is only supported when ETP==1",
     {"etp": 1}, {"num_moe_experts": 4, "tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 1,
                  "sequence_parallel": True, "add_bias_linear": True}),
]


@pytest.mark.parametrize(("name", "model", "plan", "args", "error", "fix", "fixed"), MEGATRON_CASES,
                         ids=[c[0] for c in MEGATRON_CASES])
def test_megatron_core_refuses_what_the_rule_refuses(name, model, plan, args, error, fix, fixed):
    """The plan the rule refuses is the TransformerConfig Megatron-Core 0.16.1 refuses; changed, both accept it."""
    refused = Plan(global_batch=8, micro_batch=1, **{"dp": 2} | plan)
    assert REFUSALS[name].test(refused, model, MCORE)
    with pytest.raises((ValueError, AssertionError), match=error):
        _transformer_config(**args)
    accepted = replace(refused, **fix)
    assert not REFUSALS[name].test(accepted, model, MCORE)
    _transformer_config(**fixed)


def test_megatron_core_refuses_cuda_graphs_with_offload_or_full_recompute():
    graphed = MCORE.with_(cuda_graphs=True)
    plan = Plan(dp=1, global_batch=8, micro_batch=1, offload_activations=True, offload_layers=1)
    assert REFUSALS["cuda_graphs_with_offload"].test(plan, TINY, graphed)
    assert not REFUSALS["cuda_graphs_with_offload"].test(plan, TINY, MCORE)
    with pytest.raises(ValueError, match="CUDA graphs not supported with CPU offloading"):
        _transformer_config(cuda_graph_impl="local", **OFFLOAD)
    full = Plan(dp=1, global_batch=8, micro_batch=1, recompute="full")
    assert REFUSALS["cuda_graphs_with_full_recompute"].test(full, TINY, graphed)
    with pytest.raises(AssertionError, match="full recompute is only supported with full iteration"):
        _transformer_config(cuda_graph_impl="transformer_engine", recompute_granularity="full",
                            recompute_method="block", recompute_num_layers=1)


def test_megatron_core_refuses_bf16_moments_without_the_distributed_optimizer():
    from megatron.core.optimizer.optimizer_config import OptimizerConfig

    plan = Plan(dp=2, global_batch=8, micro_batch=1, optimizer="adam-bf16", zero=0)
    assert REFUSALS["precision_aware_without_distributed"].test(plan, TINY, MCORE)
    assert not REFUSALS["precision_aware_without_distributed"].test(replace(plan, zero=1), TINY, MCORE)
    with pytest.raises(AssertionError, match="only supported with distributed optimizer"):
        OptimizerConfig(optimizer="adam", use_precision_aware_optimizer=True, use_distributed_optimizer=False)


def test_torchtitan_parallel_dims_refuse_what_the_rules_refuse():
    """ParallelDims (torchtitan 0.2.2) refuses etp other than 1 or tp with ep > 1; its sequence divisor is
    tp * 2 * cp: 4 * 2 * 2 = 16, so seq_length 8200 (= 16 * 512 + 8) is refused and 8192 is not."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    titan, moe = load_stack("torchtitan"), load_model("qwen3-30b-a3b")
    dims = {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 4, "pp": 1, "world_size": 8}
    with pytest.raises(AssertionError, match="ETP=TP or ETP=1"):
        ParallelDims(**dims, ep=2, etp=2)
    plan = Plan(dp=1, tp=4, ep=2, etp=2, global_batch=8, micro_batch=1, sequence_parallel=True)
    assert REFUSALS["experts_not_over_tp"].test(plan, moe, titan)
    assert not REFUSALS["experts_not_over_tp"].test(replace(plan, etp=1), moe, titan)
    assert not REFUSALS["experts_not_over_tp"].test(replace(plan, etp=4), moe, titan)
    assert ParallelDims(**(dims | {"cp": 2, "world_size": 16}), ep=1, etp=1).seq_len_divisor == 16
    cp_plan = Plan(dp=1, tp=4, cp=2, global_batch=8, micro_batch=1, sequence_parallel=True)
    assert REFUSALS["seq_not_divisible"].test(cp_plan, replace(TINY, seq_length=8200), titan)
    assert not REFUSALS["seq_not_divisible"].test(cp_plan, replace(TINY, seq_length=8192), titan)


def test_deepspeed_builds_no_zero_optimizer_to_offload_at_stage_0(monkeypatch):
    from deepspeed.runtime import config as ds

    monkeypatch.setattr(ds.dist, "get_rank", lambda *args, **kwargs: 0)

    class _DataParallel:
        def get_data_parallel_world_size(self) -> int:
            return 1

    for stage, enabled in ((0, False), (1, True)):
        loaded = ds.DeepSpeedConfig({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
                                     "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}}},
                                    mpu=_DataParallel())
        assert loaded.zero_enabled is enabled
        plan = Plan(dp=1, global_batch=8, micro_batch=8, zero=stage, offload_optimizer=True)
        assert REFUSALS["offload_without_zero"].test(plan, TINY, load_stack("deepspeed")) is not enabled


def _build_megatron(model, plan):
    """Megatron-Core's TransformerConfig with a ranked plan's parallel layout, recompute and offload."""
    per_stage = -(-model.num_layers // plan.pp)
    kw = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
          "num_attention_heads": model.num_heads, "num_query_groups": model.num_kv_heads,
          "ffn_hidden_size": model.ffn_hidden_size, "add_bias_linear": model.linear_bias,
          "tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
          "context_parallel_size": plan.cp, "expert_model_parallel_size": plan.ep,
          "expert_tensor_parallel_size": plan.etp, "sequence_parallel": plan.sequence_parallel}
    if plan.vpp > 1:
        kw["virtual_pipeline_model_parallel_size"] = plan.vpp
    if plan.last_stage_layers:
        kw["num_layers_in_last_pipeline_stage"] = plan.last_stage_layers
    if model.is_moe:
        kw |= {"num_moe_experts": model.num_experts, "moe_ffn_hidden_size": model.moe_ffn_hidden_size,
               "moe_router_topk": model.moe_topk}
    if plan.recompute != "none":
        kw["recompute_granularity"] = plan.recompute
    if plan.recompute == "full":
        kw |= {"recompute_method": "block", "recompute_num_layers": plan.recompute_layers or per_stage}
    if plan.offload_activations:
        kw |= {"cpu_offloading": True, "cpu_offloading_num_layers": plan.offload_layers or per_stage}
    return _transformer_config(**kw)


def test_deepspeeds_pipeline_engine_refuses_zero_2_and_3():
    # runtime/pipe/engine.py asserts zero_optimization_stage() < ZeroStageEnum.gradients (2) before anything else;
    # Megatron-DeepSpeed runs its pipeline on that engine, ZeRO-3 without a pipeline (--no-pipeline-parallel)
    from deepspeed.runtime.zero.config import ZeroStageEnum

    assert int(ZeroStageEnum.gradients) == 2
    stack = load_stack("megatron-deepspeed")
    rule = REFUSALS["zero_grads_with_pipeline"]
    for zero, pp, refused in ((1, 2, False), (2, 2, True), (3, 4, True), (3, 1, False)):
        plan = Plan(dp=2, pp=pp, zero=zero, global_batch=16, micro_batch=1)
        assert bool(rule.test(plan, TINY, stack)) is refused, (zero, pp)
    assert "zero_grads_with_pipeline" in stack.supports.refuses


@pytest.mark.parametrize(("model_name", "system", "gpus", "space"), [
    ("llama3-70b", "a100", 64, {}),  # offload of every layer led before the rules (#1 at 175.1 s)
    ("llama3-8b", "h100", 8, {"offload_layers": 16}),  # partial offload: runs at pp = 1 without recompute
    ("mixtral-8x7b", "h100", 64, {}),
    ("gpt-oss-20b", "h100", 32, {}),  # MoE with biases: etp = 1
])
def test_megatron_core_search_ranks_only_plans_megatron_core_builds(model_name, system, gpus, space):
    model = load_model(model_name)
    result = search(model, load_system(system).cluster(gpus), Space(global_batch=256, stack=MCORE, **space),
                    top_k=10, workers=1)
    assert result.plans
    for est in result.plans:
        assert MCORE.supports.problems(est.plan, model, MCORE) == []
        _build_megatron(model, est.plan)  # raises where Megatron-Core 0.16.1 refuses the plan
    refusals = {k: v for k, v in result.rejected.items() if k.startswith("megatron-core refuses")}
    assert refusals and all("megatron-core 0.16.1" in result.examples[k] or "megatron-lm core_v0.17.0" in
                            result.examples[k] for k in refusals)


def test_the_known_leaders_leave_the_ranking():
    """Before the rules: llama3-70b on 64 A100s ranked offload of every layer first under Megatron-Core; qwen3-30b-a3b
    under torchtitan could rank tp > 1 without sequence parallelism. Now neither ranks, and both are tallied."""
    cases = [("llama3-70b", "a100", "megatron-core", "activation offload of every layer"),
             ("qwen3-30b-a3b", "h100", "torchtitan", "tp > 1 without sequence parallelism")]
    for model_name, system, framework, what in cases:
        stack, model = load_stack(framework), load_model(model_name)
        result = search(model, load_system(system).cluster(64), Space(global_batch=512, stack=stack), top_k=10,
                        workers=1)
        assert all(stack.supports.problems(e.plan, model, stack) == [] for e in result.plans)
        assert any(what in reason for reason in result.rejected)


def test_estimate_prices_a_refused_plan_and_says_who_refuses_it():
    """``estimate`` prices any plan; under a framework that refuses it, it names the refusal and its source."""
    from click.testing import CliRunner

    from meshplan.cli.main import cli

    args = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--pp", "2",
            "--offload-activations", "--recompute", "none"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "note: megatron-core refuses this plan: activation offload with pp > 1 (megatron-core 0.16.1 " \
           "megatron/core/transformer/transformer_config.py:1144-1147)" in result.stderr
    assert "with recompute" not in result.stderr
    data = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert data["refused_by_framework"] == [f"activation offload with pp > 1 ({REFUSALS['offload_with_pp'].source})"]


def test_the_plan_space_view_names_the_frameworks_as_one_plan_is_judged():
    """The report's plan-space column (report/space.frameworks, on the sample's arrays) names, for each sampled plan
    of qwen3-30b-a3b on 16 H100s under --framework any, the presets that Supports.problems (one plan, with the
    refusals) finds run it."""
    from meshplan.report.space import columns
    from meshplan.search.explore import LAYOUTS, SCHEDULES, Explore
    from meshplan.specs.stack import frameworks_running

    model = load_model("qwen3-30b-a3b")
    result = search(model, load_system("h100").cluster(16), Space(global_batch=64, stack=load_stack("any")), top_k=3,
                    workers=1, explore=Explore(sample=200))
    ps = result.explored
    cols, c, grid = columns(ps, result.model, result.space), ps.columns, ps.grid
    sizes = ("dp", "tp", "pp", "cp", "ep", "etp", "tp2", "vpp", "micro_batch", "last_stage_layers")
    names = set()
    for i in range(len(ps)):
        plan = Plan(global_batch=64, **{k: int(c[k][i]) for k in sizes},
                    sequence_parallel=bool(c["sequence_parallel"][i]), recompute=grid[0][c["recompute"][i]],
                    zero=int(grid[1][c["zero"][i]]), offload_optimizer=bool(grid[2][c["offload_optimizer"][i]]),
                    offload_activations=bool(grid[3][c["offload_activations"][i]]),
                    tensor_layout=LAYOUTS[c["layout"][i]], schedule=SCHEDULES[c["schedule"][i]])
        shown = cols["vocab"]["framework"][cols["framework"][i]]
        assert shown == (", ".join(frameworks_running(plan, model)) or "none"), plan.describe()
        names.add(shown)
    assert len(names) > 2  # the sample spans plans several frameworks run and some none does
