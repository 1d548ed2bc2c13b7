"""Megatron-LM's own entry points read every kind of script ``--emit megatron`` writes (issue 80): bash runs the
script as a user would, the arguments it hands ``torchrun ... pretrain_gpt.py`` go through Megatron-LM's
``parse_args`` and ``validate_args`` (megatron/training/arguments.py, tag core_v0.17.0, from PyPI's megatron-core
0.17.0 wheel: tests/framework_parsers.py) and ``core_transformer_config_from_args`` builds Megatron-Core's
TransformerConfig from them, with the environment the script exported, as on the target GPU. Covered: every model
preset; every plan feature meshplan writes (interleaving, uneven stages, optimizer offload, bf16 moments, MoE, MLA,
MTP, every recompute form, fp8 recipes, context parallelism, SGD, bf16 gradients, overlaps); every plan the
Megatron-Core search ranks in its top 5 on the issue's cases. The parser is strict (the last tests): the scripts
meshplan wrote before (``--virtual-pipeline-model-parallel-size``, offload without the precision-aware optimizer, no
CUDA_DEVICE_MAX_CONNECTIONS) are refused, and the ``--from`` reader refuses each of them too
(configs/megatron_rules.py: each rule's quote at its cited lines, each rule's example refused by validate_args).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from framework_parsers import megatron_arguments, parser_path
from meshplan.cli.main import cli
from meshplan.configs import emit, read
from meshplan.configs.megatron_rules import ARGUMENT_RULES
from meshplan.errors import SpecError
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

MCORE = load_stack("megatron-core")
HOPPER = [9, 0]


def _case(tmp_path: Path, text: str, gpus: int, label: str, capability: list[int] = HOPPER) -> dict:
    script = tmp_path / f"{label.replace(' ', '_').replace('/', '-')}.sh"
    script.write_text(text)
    argv, env = megatron_arguments(script, "--mock-data")  # what the user appends: the data
    return {"argv": argv, "env": env, "world_size": gpus, "capability": capability, "label": label}


def _verdicts(megatron, cases: list[dict]) -> list[tuple[dict, dict]]:
    return list(zip(cases, megatron(cases), strict=True))


def _failures(pairs: list[tuple[dict, dict]]) -> list[str]:
    return [f"{case['label']}: {verdict['error']}" for case, verdict in pairs if not verdict["ok"]]


def _basic_plan(name: str) -> Plan:
    """A plan of 16 GPUs that every preset can be written with: tp 2 where it divides the heads and query groups,
    pp 2, experts over 2 ranks."""
    model = load_model(name)
    tp = 2 if model.num_heads % 2 == 0 and model.num_kv_heads % 2 == 0 else 1
    pp = 2 if model.num_layers % 2 == 0 else 1
    ep = 2 if model.is_moe and model.num_experts % 2 == 0 else 1
    return Plan(dp=16 // (tp * pp), tp=tp, pp=pp, ep=ep, etp=1 if model.is_moe else tp, sequence_parallel=tp > 1,
                micro_batch=1, global_batch=64, zero=1)


def test_every_model_preset_is_read_by_megatron_lm(tmp_path, megatron):
    cases, refused = [], {}
    for name in preset_names():
        try:
            text = emit("megatron", load_model(name), _basic_plan(name), MCORE)
        except SpecError as e:  # a model Megatron-LM's arguments cannot build is refused with its reason
            refused[name] = str(e)
            continue
        cases.append(_case(tmp_path, text, 16, name))
    pairs = _verdicts(megatron, cases)
    assert not _failures(pairs)
    assert len(cases) >= 60, refused
    by_name = {case["label"]: verdict for case, verdict in pairs}
    assert by_name["deepseek-v3"]["config"] == "MLATransformerConfig"
    assert by_name["qwen3-30b-a3b"]["experts"] == 128 and by_name["llama3-8b"]["experts"] is None


# (label, model, plan fields over the 16-GPU base, stack fields): every plan feature the emitter writes
FEATURES = [
    ("interleaved", "llama3-8b", {"pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved"}, {}),
    ("interleaved, uneven last stage", "llama3-8b",
     {"pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved", "last_stage_layers": 6, "first_stage_layers": 6},
     {}),
    ("interleaved without p2p overlap", "llama3-8b", {"pp": 4, "dp": 2, "vpp": 4, "schedule": "interleaved"},
     {"overlap_pp": False}),
    ("uneven first and last stages", "llama3-8b", {"pp": 4, "dp": 2, "first_stage_layers": 7,
                                                   "last_stage_layers": 7}, {}),
    ("optimizer offload", "llama3-8b", {"offload_optimizer": True}, {}),
    ("bf16 moments", "llama3-8b", {"optimizer": "adam-bf16"}, {}),
    ("bf16 moments offloaded", "llama3-8b", {"optimizer": "adam-bf16", "offload_optimizer": True}, {}),
    ("full recompute, every layer", "llama3-8b", {"recompute": "full"}, {}),
    ("full recompute, 4 layers a stage", "llama3-8b", {"recompute": "full", "recompute_layers": 4}, {}),
    ("selective recompute", "llama3-8b", {"recompute": "selective"}, {}),
    ("selective recompute of core_attn and mlp", "llama3-8b",
     {"recompute": "selective", "recompute_modules": ("core_attn", "mlp")}, {}),
    ("fp8 delayed", "llama3-8b", {"precision": "fp8"}, {}),
    ("fp8 current scaling", "llama3-8b", {"precision": "fp8"}, {"fp8_scaling": "current"}),
    ("mxfp8", "llama3-8b", {"precision": "mxfp8"}, {}),
    ("fp16", "llama3-8b", {"precision": "fp16"}, {}),
    ("context parallel ring", "llama3-8b", {"cp": 2, "dp": 2}, {}),
    ("context parallel all-gather", "llama3-8b", {"cp": 2, "dp": 2}, {"cp_comm": "allgather"}),
    ("sgd", "llama3-8b", {"optimizer": "sgd"}, {}),
    ("sgd with momentum", "llama3-8b", {"optimizer": "sgd-momentum"}, {}),
    ("bf16 gradients", "llama3-8b", {"grad_bytes": 2}, {}),
    ("ZeRO-0", "llama3-8b", {"zero": 0}, {}),
    ("two distributed-optimizer instances", "llama3-8b", {"distributed_optimizer_instances": 2}, {}),
    ("overlaps and tp 1", "llama3-8b", {"tp": 1, "dp": 8, "sequence_parallel": False},
     {"overlap_dp": True, "overlap_tp": True}),
    ("overlaps", "llama3-8b", {}, {"overlap_dp": True, "overlap_tp": True}),
    ("overlaps and the weight gather", "llama3-8b", {}, {"overlap_dp": True, "overlap_param_gather": True}),
    ("flash attention", "llama3-8b", {}, {"attention_kernel": "fa2"}),
    ("MoE, experts over 8", "qwen3-30b-a3b", {"ep": 8}, {"expert_gemm": "grouped"}),
    ("MoE interleaved", "qwen3-30b-a3b", {"pp": 4, "dp": 2, "vpp": 3, "schedule": "interleaved", "ep": 2}, {}),
    ("MoE selective recompute of moe_act", "qwen3-30b-a3b",
     {"recompute": "selective", "recompute_modules": ("moe_act", "layernorm")}, {"expert_gemm": "grouped"}),
    ("MLA, MTP and dense first layers", "deepseek-v3", {"pp": 4, "dp": 2, "ep": 2, "last_stage_layers": 13}, {}),
    ("MLA recompute of the up projections", "deepseek-v3",
     {"recompute": "selective", "recompute_modules": ("mla_up_proj",)}, {}),
    ("squared ReLU", "nemotron4-15b", {}, {}),
]
# the activation core_transformer_config_from_args builds (arguments.py:1667-1675 @ core_v0.17.0): SiLU with --swiglu
# (gated), squared_relu with --squared-relu, else TransformerConfig's default GeLU
ACTIVATION = {"swiglu": "silu", "relu2": "squared_relu", "gelu": "gelu"}


def test_every_plan_feature_is_read_by_megatron_lm(tmp_path, megatron):
    cases, plans, texts = [], [], {}
    for label, name, fields, stack in FEATURES:
        model = load_model(name)
        base = _basic_plan(name)
        plan = replace(base, **fields)
        text = emit("megatron", model, plan, MCORE.with_(**stack))
        cases.append(_case(tmp_path, text, plan.num_gpus, label))
        plans.append(plan)
        texts[label] = "\n".join(ln for ln in text.splitlines() if "meshplan:" not in ln)  # as a user's own file
    pairs = _verdicts(megatron, cases)
    assert not _failures(pairs)
    for plan, (_, verdict) in zip(plans, pairs, strict=True):  # what Megatron built is the plan
        assert verdict["sizes"] == [plan.tp, plan.pp, plan.cp, plan.ep, plan.vpp]
        assert verdict["batch"] == [plan.micro_batch, plan.global_batch]
        assert verdict["offload"] == plan.offload_optimizer
        assert verdict["recompute"][0] == {"none": None}.get(plan.recompute, plan.recompute)
    for (label, name, _, _), (_, verdict) in zip(FEATURES, pairs, strict=True):  # and the model's activation
        assert verdict["activation"] == ACTIVATION[load_model(name).mlp], label
    for (label, name, _, _), (case, verdict) in zip(FEATURES, pairs, strict=True):  # and the reader reads it so
        plan, stack = read("megatron", load_model(name), case["world_size"], text=texts[label])
        assert [verdict["sequence_parallel"], verdict["distributed_optimizer"]] == [plan.sequence_parallel,
                                                                                   plan.zero == 1], label
        # overlap_p2p_comm acts (and is kept by validate_args, arguments.py:832-848) with interleaving only
        assert verdict["overlaps"][:2] == [stack.overlap_dp, stack.overlap_param_gather], label
        assert plan.vpp == 1 or verdict["overlaps"][2] == stack.overlap_pp, label


# the cases and three more: every plan of the Megatron-Core search's top 5, as `plan --emit` writes #1
SEARCHES = [("qwen3-30b-a3b", "h100", 64), ("llama3-70b", "h100", 256), ("llama3-8b", "h100", 32),
            ("mixtral-8x7b", "h100", 64), ("deepseek-v3", "h200", 1024)]


def test_the_searchs_leading_plans_pass_validate_args(tmp_path, megatron):
    from meshplan.cli.common import default_global_batch
    from meshplan.search import Space, search
    from meshplan.specs.hardware import load_system

    cases = []
    for name, system, gpus in SEARCHES:
        model = load_model(name)
        space = Space(global_batch=default_global_batch(model.seq_length, 1, 1), stack=MCORE)  # the CLI's default
        result = search(model, load_system(system).cluster(gpus), space, top_k=5, workers=1)
        assert result.plans, name
        for rank, est in enumerate(result.plans, 1):
            text = emit("megatron", model, est.plan, est.stack)
            cases.append(_case(tmp_path, text, gpus, f"{name} on {gpus} {system} #{rank} {est.plan.describe()}"))
    assert not _failures(_verdicts(megatron, cases))


@pytest.mark.parametrize(("name", "gpus"), [("llama3-70b", 256), ("qwen3-30b-a3b", 64)])
def test_plan_emit_megatron_writes_what_megatron_lm_runs(tmp_path, megatron, name, gpus):
    """The issue's two commands, as typed: the file `plan --emit megatron --emit-to` writes passes validate_args,
    names the release it targets, and exports what validate_args asks of the environment."""
    path = tmp_path / "args.sh"
    result = CliRunner().invoke(cli, ["plan", "--model", name, "--system", "h100", "--gpus", str(gpus), "--emit",
                                      "megatron", "--emit-to", str(path)])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert "Megatron-LM core_v0.17.0" in text.splitlines()[2]
    ((_, verdict),) = _verdicts(megatron, [_case(tmp_path, text, gpus, name)])
    assert verdict["ok"], verdict


def test_megatron_lm_refuses_what_meshplan_wrote_before(tmp_path, megatron):
    """The parser can fail: the scripts of main at 7fd4a7b (issue 80) are refused, each for its reason."""
    model = load_model("llama3-8b")
    plan = replace(_basic_plan("llama3-8b"), offload_optimizer=True)
    good = emit("megatron", model, plan, MCORE)
    old = {
        "vpp": good.replace("--num-layers 32", "--num-layers 32\n  --virtual-pipeline-model-parallel-size 2"),
        "offload": good.replace("  --use-precision-aware-optimizer\n", ""),
        "env": good.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1", ""),
    }
    errors = {"vpp": "unrecognized arguments: --virtual-pipeline-model-parallel-size 2",
              "offload": "must be used in conjunction with `--use-precision-aware-optimizer`",
              "env": "CUDA_DEVICE_MAX_CONNECTIONS to 1"}
    cases = [_case(tmp_path, text, 16, key) for key, text in old.items()]
    for case, verdict in _verdicts(megatron, cases):
        assert not verdict["ok"] and errors[case["label"]] in verdict["error"], (case["label"], verdict)
    for key in ("vpp", "offload"):  # the --from reader refuses them too, naming Megatron-LM's lines
        with pytest.raises(SpecError, match="Megatron-LM refuses .*arguments.py"):
            read("megatron", model, 16, text=old[key])


def test_each_reader_rule_quotes_megatron_lm_at_its_lines():
    lines = (parser_path("megatron-lm") / "megatron" / "training" / "arguments.py").read_text().splitlines()
    for rule in ARGUMENT_RULES:
        first, last = rule.lines
        assert rule.quote in "\n".join(lines[first - 1:last]), f"{rule.source} no longer says {rule.quote!r}"
    assert (parser_path("megatron-lm") / "VERSION").read_text().strip() == "megatron-core==0.17.0"


# each rule's example: (rule, the changes to the llama3-8b script that break it, validate_args' words, GPUs)
RULE_EXAMPLES = [
    ("no_virtual_pipeline_argument",
     [("--num-layers 32", "--num-layers 32\n  --virtual-pipeline-model-parallel-size 2")], "unrecognized arguments",
     16),
    ("one_virtual_pipeline_argument", [("--num-virtual-stages-per-pipeline-rank 2", "--num-virtual-stages-per-"
                                        "pipeline-rank 2\n  --num-layers-per-virtual-pipeline-stage 4")],
     "No more than one", 16),
    ("uneven_stages_by_layers", [("--num-virtual-stages-per-pipeline-rank 2", "--num-layers-per-virtual-pipeline-"
                                  "stage 4\n  --decoder-last-pipeline-num-layers 5")],
     "please use --num-virtual-stages-per-pipeline-rank", 16),
    ("offload_needs_precision_aware", [("--use-precision-aware-optimizer", "--optimizer-cpu-offload")],
     "in conjunction with", 16),
    ("selective_without_method", [("--bf16", "--bf16\n  --recompute-granularity selective\n  --recompute-method "
                                   "uniform")], "recompute method is not yet supported", 16),
    ("layers_divisible_by_pp", [("--num-virtual-stages-per-pipeline-rank 2", "--bf16"),
                                ("--pipeline-model-parallel-size 4", "--pipeline-model-parallel-size 3")],
     "Number of layers should be divisible", 12),
    ("seq_divisible_by_2cp", [("--seq-length 8192", "--seq-length 8190"),
                              ("--context-parallel-size 1", "--context-parallel-size 2")],
     "seq-length should be a multiple", 32),
    ("interleaved_needs_pp", [("--pipeline-model-parallel-size 4", "--pipeline-model-parallel-size 2\n  "
                               "--no-overlap-p2p-communication")], "When interleaved schedule is used", 16),
    ("tp_overlap_needs_sp", [("--sequence-parallel", "--tp-comm-overlap")], "sequence parallelism is enabled", 16),
    ("param_gather_needs_grad_reduce", [("--bf16", "--bf16\n  --overlap-param-gather")], "overlap-param-gather", 16),
]


def test_each_reader_rule_is_one_validate_args_refuses(tmp_path, megatron):
    model = load_model("llama3-8b")
    plan = Plan(dp=2, tp=2, pp=4, vpp=2, schedule="interleaved", sequence_parallel=True, micro_batch=1,
                global_batch=64, zero=1, optimizer="adam-bf16")
    good = emit("megatron", model, plan, MCORE)
    assert {r.name for r in ARGUMENT_RULES} == {example[0] for example in RULE_EXAMPLES}
    cases = []
    for name, changes, _, gpus in RULE_EXAMPLES:
        text = good
        for old, new in changes:
            assert f"  {old}\n" in text, (name, old)
            text = text.replace(f"  {old}\n", f"  {new}\n", 1)
        first = next(r for r in ARGUMENT_RULES if r.name == name).lines[0]
        with pytest.raises(SpecError, match=f"Megatron-LM refuses .*arguments.py:{first}-"):
            read("megatron", model, gpus, text=text)
        cases.append(_case(tmp_path, text, gpus, name))
    cases.append(_case(tmp_path, good, plan.num_gpus, "unchanged"))
    pairs = _verdicts(megatron, cases)
    for (case, verdict), example in zip(pairs[:-1], RULE_EXAMPLES, strict=True):
        assert not verdict["ok"] and example[2] in verdict["error"], (case["label"], verdict)
    assert pairs[-1][1]["ok"], pairs[-1]


# a flex stack: DeepSeek-V3 across 2 expert ranks with MLA and uneven stages, Qwen3-30B-A3B with experts over 8
FLEX = [("deepseek-v3", {"pp": 4, "dp": 2, "ep": 2, "last_stage_layers": 13}), ("qwen3-30b-a3b", {"ep": 8})]


def test_the_flex_dispatcher_is_written_as_megatron_lm_runs_it_and_read_back(tmp_path, megatron):
    """`--moe-token-dispatcher-type flex` with its backend named (DeepEP, or HybridEP where the stack says so) is what
    Megatron-LM builds its TransformerConfig with, and reads back as the flex stack with that backend; DeepEP under
    the alltoall dispatcher is refused by Megatron-Core and by the reader alike, and flex at tp = ep = 1 (which
    Megatron-Core's dispatcher asserts against) is refused by the writer."""
    stack = MCORE.with_(moe_dispatcher="flex")
    cases, texts = [], []
    for name, fields in FLEX:
        plan = replace(_basic_plan(name), **fields)
        texts.append((name, plan, emit("megatron", load_model(name), plan, stack)))
        cases.append(_case(tmp_path, texts[-1][2], plan.num_gpus, f"{name} flex"))
    # the stack's backend is the one written: HybridEP (Stack.flex_backend), as Megatron-Bridge's Qwen3-30B H100 recipe
    hybrid = stack.with_(flex_backend="hybridep")
    name, fields = FLEX[1]
    plan = replace(_basic_plan(name), **fields)
    hybrid_text = emit("megatron", load_model(name), plan, hybrid)
    assert "--moe-flex-dispatcher-backend hybridep" in hybrid_text
    cases.append(_case(tmp_path, hybrid_text, plan.num_gpus, f"{name} flex hybridep"))
    deepep_alltoall = texts[0][2].replace("--moe-token-dispatcher-type flex", "--moe-token-dispatcher-type alltoall") \
        .replace("--moe-flex-dispatcher-backend deepep", "--moe-enable-deepep")
    cases.append(_case(tmp_path, deepep_alltoall, 16, "deepep under alltoall"))
    *verdicts, hybrid_verdict, refused = [v for _, v in _verdicts(megatron, cases)]
    assert all(v["ok"] and v["dispatcher"] == ["flex", "deepep"] for v in verdicts), verdicts
    assert hybrid_verdict["ok"] and hybrid_verdict["dispatcher"] == ["flex", "hybridep"], hybrid_verdict
    assert not refused["ok"] and "only supported with flex token dispatcher" in refused["error"]
    for name, plan, text in texts:
        assert read("megatron", load_model(name), plan.num_gpus, text=text) == (plan, stack)
    assert read("megatron", load_model(name), plan.num_gpus, text=hybrid_text) == (plan, hybrid)
    with pytest.raises(SpecError, match="only with --moe-token-dispatcher-type flex"):
        read("megatron", load_model("deepseek-v3"), 16, text=deepep_alltoall)
    single = replace(_basic_plan("qwen3-30b-a3b"), tp=1, ep=1, dp=8, sequence_parallel=False)
    with pytest.raises(SpecError, match="TPxEP > 1"):
        emit("megatron", load_model("qwen3-30b-a3b"), single, stack)


def test_token_drop_is_written_as_megatron_lm_runs_it_and_read_back(tmp_path, megatron):
    """A plan that drops tokens (Plan.moe_expert_capacity_factor, padded or not: specs/token_drop.py) is written as
    --moe-expert-capacity-factor (with --moe-pad-expert-input-to-capacity), which Megatron-LM builds into its
    TransformerConfig, and reads back as the same plan; a dropless plan writes neither; the padding alone is refused
    by Megatron-Core (TransformerConfig: "moe_expert_capacity_factor must be set") and by meshplan's check."""
    name = "qwen3-30b-a3b"
    base = replace(_basic_plan(name), ep=8)
    plans = [base.with_(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
             base.with_(moe_expert_capacity_factor=1.25)]
    texts = [emit("megatron", load_model(name), plan, MCORE) for plan in plans]
    assert "--moe-expert-capacity-factor 1.0" in texts[0] and "--moe-pad-expert-input-to-capacity" in texts[0]
    assert "--moe-pad-expert-input-to-capacity" not in texts[1]
    assert "capacity" not in emit("megatron", load_model(name), base, MCORE)
    pad_alone = texts[0].replace("--moe-expert-capacity-factor 1.0", "")
    cases = [_case(tmp_path, t, base.num_gpus, f"token drop {i}") for i, t in enumerate([*texts, pad_alone])]
    *verdicts, refused = [v for _, v in _verdicts(megatron, cases)]
    assert [v["capacity"] for v in verdicts] == [[1.0, True], [1.25, False]], verdicts
    assert not refused["ok"] and "moe_expert_capacity_factor must be set" in refused["error"], refused
    for plan, text in zip(plans, texts, strict=True):
        assert read("megatron", load_model(name), plan.num_gpus, text=text) == (plan, MCORE)
    # Megatron-Bridge's overrides: the same TransformerConfig fields, read back alike
    nemo = emit("nemo", load_model(name), plans[0], load_stack("megatron-bridge"))
    assert "model.moe_expert_capacity_factor=1.0" in nemo and "model.moe_pad_expert_input_to_capacity=true" in nemo
    assert read("nemo", load_model(name), plans[0].num_gpus, text=nemo)[0] == plans[0]
    with pytest.raises(SpecError, match="writes dropless MoE only"):
        emit("torchtitan", load_model(name), plans[0], load_stack("torchtitan"))
