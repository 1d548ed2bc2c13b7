"""The frameworks build the model meshplan priced from the config meshplan emits (issue 47), for a dense model
(llama3-8b, llama3-70b), GQA with MoE (mixtral-8x7b) and MLA with MoE (deepseek-v3), on the meta device:

- torchtitan 0.2.2: its ConfigManager loads the job TOML; where the TOML imports a flavour module
  (``[experimental] custom_import``), the module is the one written in the TOML's comment block; then what
  torchtitan/train.py does: ``get_train_spec(name).model_args[flavor]``, ``update_from_config(job)`` and the model
  class on the meta device. Its parameters are ModelSpec.params() (Hugging Face's count), less what torchtitan keeps
  as a buffer (DeepSeek-V3's router score-correction bias, 256 per MoE layer: torchtitan's ``expert_bias``).

The frameworks' imports are slow (torchtitan ~10 s, Megatron-Core ~5 s); each test builds one model.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import sys
from dataclasses import replace

import pytest

from meshplan.configs import emit
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
MODELS = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3"]
# a plan each framework writes: 8 x 8 GPUs, tp 8 over a node, experts over the data-parallel ranks
PLAN = {"llama3-8b": Plan(dp=8, tp=8, global_batch=64), "llama3-70b": Plan(dp=4, tp=8, pp=2, global_batch=64),
        "mixtral-8x7b": Plan(dp=8, tp=8, ep=8, etp=1, global_batch=64),
        "deepseek-v3": Plan(dp=8, tp=8, ep=8, etp=1, global_batch=64),
        "qwen3-30b-a3b": Plan(dp=8, tp=4, ep=8, etp=1, global_batch=64)}


def _torchtitan_buffers_as_params(model: ModelSpec) -> int:
    """What torchtitan keeps as buffers of what Hugging Face counts as parameters: DeepSeek-V3's per-expert
    score-correction bias (E per MoE layer: 256 x 58 = 14,848)."""
    return model.num_experts * model.num_moe_layers if model.router_bias else 0


def _torchtitan_model(tmp_path, text: str):
    from torchtitan.config.manager import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    path = tmp_path / "job.toml"
    path.write_text(text)
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    if job.experimental.custom_import:  # the flavour module the TOML carries, saved as the TOML says
        lines = text.splitlines()
        module = job.experimental.custom_import
        start, end = lines.index(f"# ---- {module}.py ----"), lines.index(f"# ---- end of {module}.py ----")
        (tmp_path / f"{module}.py").write_text("\n".join(ln.removeprefix("#").removeprefix(" ")
                                                         for ln in lines[start + 1:end]) + "\n")
        sys.path.insert(0, str(tmp_path))
        try:
            sys.modules.pop(module, None)
            importlib.import_module(module)
        finally:
            sys.path.remove(str(tmp_path))
    import torch

    spec = get_train_spec(job.model.name)
    args = copy.deepcopy(spec.model_args[job.model.flavor])
    args.update_from_config(job)
    with torch.device("meta"):
        return job, spec.model_cls(args)


@pytest.mark.parametrize("name", [*MODELS, "qwen3-30b-a3b"])
def test_torchtitan_builds_the_priced_model_from_the_emitted_toml(tmp_path, name):
    model = load_model(name)
    zero = 1 if PLAN[name].pp > 1 else 3  # its FSDP2 keeps a pipeline stage gathered: ZeRO-1 (fsdp_stage_under_pp)
    text = emit("torchtitan", model, replace(PLAN[name], zero=zero, recompute_modules=("op_sac",)),
                load_stack("torchtitan"))
    job, built = _torchtitan_model(tmp_path, text)
    params = sum(p.numel() for p in built.parameters())
    assert params == model.params() - _torchtitan_buffers_as_params(model), (name, params, model.params())
    assert tuple(built.tok_embeddings.weight.shape) == (model.vocab_size, model.hidden_size)
    assert tuple(built.output.weight.shape) == (model.vocab_size, model.hidden_size)
    assert len(built.layers) == model.num_layers
    assert job.training.seq_len == model.seq_length
    assert (job.model.name, job.model.flavor) != ("llama3", "debugmodel")


def test_torchtitan_flavour_of_a_model_it_does_not_register(tmp_path):
    """A dense Llama-like model of no registered flavour (llama3-8b with 40 layers and FFN 12,288): the llama3
    flavour meshplan writes builds it: 8,030,261,248 - 32 x 3 x 4096 x 14336 + 40 x 3 x 4096 x 12288 and the rest."""
    model = dataclasses.replace(load_model("llama3-8b"), name="llama3-8b-wide", num_layers=40, ffn_hidden_size=12288)
    text = emit("torchtitan", model, Plan(dp=8, tp=8, global_batch=64, zero=3, recompute_modules=("op_sac",)),
                load_stack("torchtitan"))
    assert 'name = "llama3"' in text and 'flavor = "meshplan-llama3-8b-wide"' in text
    _, built = _torchtitan_model(tmp_path, text)
    assert sum(p.numel() for p in built.parameters()) == model.params()
    assert tuple(built.layers["0"].feed_forward.w1.weight.shape) == (12288, 4096)


def test_deepspeed_and_torchrun_launch_the_same_nodes():
    """A review found a 4-GPU plan launched as --num_nodes 4 --num_gpus 1 by DeepSpeed and 1 x 4 by torchrun: both
    now take configs.common.node_split (one node of 4; 16 GPUs: 2 nodes of 8)."""
    import json

    from meshplan.configs import emit
    from meshplan.specs.model_load import load_model
    from meshplan.specs.plan import Plan
    from meshplan.specs.stack import load_stack

    for gpus, nodes, local in ((4, 1, 4), (16, 2, 8)):
        plan = Plan(dp=gpus, global_batch=2 * gpus, zero=1, recompute="full")
        text = emit("deepspeed", load_model("llama3-8b"), plan, load_stack("deepspeed"))
        launch = next(n for n in json.loads(text)["meshplan_notes"] if n.startswith("launch:"))
        assert f"--num_nodes {nodes} --num_gpus {local} " in launch
