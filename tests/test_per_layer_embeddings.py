"""Gemma 4's per-layer embeddings (specs/model_extras.py per_layer_input, cost/ple.py, specs/hf/ple.py; issue 84
item 5): transformers' default Gemma 4 text config.json read exactly from the command line, the arithmetic of its
parameters, its work in training and serving, and Gemma 3n's structures refused by name."""

from __future__ import annotations

import json
import warnings

import pytest

from meshplan.cli import main
from meshplan.errors import PlanError
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_extras import ple_embedding_params, ple_layer_params
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _config(tmp_path, model_type: str, **changes) -> str:
    """``model_type``'s default config.json (as transformers 5.24 writes it), with ``changes``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = transformers.AutoConfig.for_model(model_type, **changes).to_json_string(use_diff=False)
    path = tmp_path / model_type / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _meta_count(model_type: str, **changes) -> int:
    cfg = transformers.AutoConfig.for_model(model_type, **changes)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def test_gemma4_reads_exactly_with_its_arithmetic(tmp_path):
    spec = load_model(_config(tmp_path, "gemma4_text"))
    assert spec.params() == _meta_count("gemma4_text") == 5_077_177_856
    # 30 layers of d = 256 inputs, H = 2304, V_p = 262,144: the table 262,144 x 7,680 = 2,013,265,920, the
    # projection 2,304 x 7,680 = 17,694,720 and its norm 256; each layer's gate and projection 2 x 2,304 x 256
    # = 1,179,648 and its norm 2,304
    assert (spec.per_layer_input, spec.per_layer_vocab) == (256, 262_144)
    assert ple_embedding_params(spec) == 2_013_265_920 + 17_694_720 + 256
    assert ple_layer_params(spec) == 1_179_648 + 2_304
    without = load_model(_config(tmp_path / "plain", "gemma4_text", hidden_size_per_layer_input=0))
    assert spec.params() - without.params() == 2_013_265_920 + 17_694_720 + 256 + 30 * (1_179_648 + 2_304)


def test_gemma4_is_priced_with_its_per_layer_work(tmp_path):
    spec = load_model(_config(tmp_path, "gemma4_text"))
    plain = load_model(_config(tmp_path / "plain", "gemma4_text", hidden_size_per_layer_input=0))
    cluster, plan, stack = load_system("h100").cluster(8), Plan(dp=8, global_batch=64), load_stack("any")
    est, base = estimate(spec, cluster, plan, stack), estimate(plain, cluster, plan, stack)
    names = {row.name for row in est.ops}
    assert {"embed/ple_lookup", "embed/ple_projection", "ple/gate", "ple/projection", "ple/norm"} <= names
    assert est.step_time > base.step_time and est.peak_memory > base.peak_memory
    # model FLOPs count the projection and the per-layer GEMMs (with their norms' weights, as 6·N counts every
    # model's), not the table's lookup: 6 x (17,694,720 + 256 + 30 x (1,179,648 + 2,304)) more a token
    per_token = (est.model_flops - base.model_flops) / (64 * spec.seq_length)
    assert per_token == pytest.approx(6 * (17_694_720 + 256 + 30 * (1_179_648 + 2_304)), rel=1e-9)


def test_gemma4_refuses_a_pipeline(tmp_path):
    spec = load_model(_config(tmp_path, "gemma4_text"))
    with pytest.raises(PlanError, match="per-layer embeddings"):
        estimate(spec, load_system("h100").cluster(16), Plan(dp=8, pp=2, global_batch=64), load_stack("any"))


def test_per_layer_work_is_served_too():
    # serving refuses Gemma 4's windowed hybrid layers; on a model of uniform layers the records add to an iteration
    from dataclasses import replace

    from meshplan.serve.estimate import serve_estimate
    from meshplan.serve.plan import ServePlan, Workload

    base = load_model("llama3-8b")
    ple = replace(base, per_layer_input=256, per_layer_vocab=32_000)
    cluster, plan, work = load_system("h100").cluster(1), ServePlan(tp=1, batch=8), Workload(input_len=1024,
                                                                                                output_len=128)
    with_ple, without = (serve_estimate(m, cluster, plan, work) for m in (ple, base))
    assert with_ple.metrics.tpot > without.metrics.tpot and with_ple.metrics.ttft > without.metrics.ttft


@pytest.mark.parametrize("model_type, changes, named", [
    ("gemma3n_text", {}, ("altup_num_inputs=4", "laurel_rank=64", "num_kv_shared_layers=15")),
    ("gemma4_text", {"num_kv_shared_layers": 10}, ("num_kv_shared_layers=10",)),
    ("gemma4_text", {"attention_k_eq_v": True}, ("attention_k_eq_v=True",)),
])
def test_unmodelled_structures_are_refused_by_name(tmp_path, capsys, model_type, changes, named):
    path = _config(tmp_path, model_type, **changes)
    code = main(["estimate", "--model", path, "--system", "h100", "--gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and all(n in err for n in named) and "Traceback" not in err


def test_gemma4_exact_from_the_command_line(tmp_path, capsys):
    path = _config(tmp_path, "gemma4_text")
    assert main(["estimate", "--model", path, "--system", "h100", "--gpus", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["params"] == _meta_count("gemma4_text") and data["fits"]
    assert main(["plan", "--model", path, "--system", "h100", "--gpus", "8", "--top", "2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["plans"][0]
    assert best["plan"]["pp"] == 1 and best["plan"]["tensor_layout"] == "1d"
