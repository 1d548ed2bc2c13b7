"""``meshplan plan`` with the sharding planner: a model file's factory, a Hugging Face config.json and a preset; JSON
scripts rely on; bad input in one line with exit status 2."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bad_input_helpers import LLAMA, fails, hf
from meshplan.cli import main

pytest.importorskip("torch")
pytest.importorskip("scipy")

MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                                        for _ in range(3))
            self.head = nn.Linear(256, 10)

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(x)
            return self.head(x).float().logsumexp(-1).mean()

    def make():
        return Net()
''')


def run(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    return code, out


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("factory") / "net.py"
    path.write_text(MODEL)
    return str(path)


def test_factory_plan_as_json(model_file, capsys):
    _, out = run(["plan", "--model", f"{model_file}:make", "--input-shape", "64x128x256", "--dtype", "bfloat16",
                  "--system", "h100", "--gpus", "8", "--json"], capsys)
    data = json.loads(out)
    assert data["fits"] and data["step_time_s"] > 0 and data["gpus"] == 8 and data["mesh"]["shape"] == [8]
    assert data["layers"] == data["traced_layers"] >= 2  # identical layers tied (the first reads the input itself)
    names = {p["name"] for p in data["parameters"]}
    assert "layers.*.0.weight" in names and "head.weight" in names  # tied layers once, index as *
    assert all(p["placements"].startswith("[") for p in data["parameters"])
    assert data["parallelize_module"].startswith("from torch.distributed.device_mesh import init_device_mesh")
    assert "\nmesh = init_device_mesh(" in data["parallelize_module"]
    assert set(data["breakdown_s"]) == {"compute_fwd", "compute_bwd", "comm_fwd", "comm_bwd", "grad_sync", "optimizer",
                                        "host_fwd", "host_bwd"}


def test_the_planner_prices_the_plans_optimizer(model_file, capsys):
    """--optimizer as Plan.optimizer names it (memory.OPTIMIZER_STATE). Beside bf16 parameters plain SGD keeps the
    fp32 master copy only, 4 bytes a parameter = 2 x its bytes, where Adam keeps master and moments, 12 = 6 x; SGD's
    step streams 2 + 8 + 2 = 12 bytes a parameter where Adam's streams 2 + 24 + 2 = 28, at every placement. Priced on
    the GPU alone (--host-dispatch 0): this small model's host-bound step would make sharding Adam's state free (the
    host-bound search of autoshard/solve.py), and the two plans would not place their parameters alike."""
    from meshplan.autoshard.memory import Accounting
    from meshplan.autoshard.planner import Request
    from meshplan.autoshard.planner import plan_sharding as plan
    from meshplan.errors import SpecError

    def planned(name: str) -> dict:
        _, out = run(["plan", "--model", f"{model_file}:make", "--input-shape", "8x128x256", "--dtype", "bfloat16",
                      "--system", "h100", "--gpus", "2", "--optimizer", name, "--host-dispatch", "0", "--json"], capsys)
        return json.loads(out)

    adam, sgd = planned("adam"), planned("sgd")
    assert sgd["breakdown_s"]["optimizer"] < adam["breakdown_s"]["optimizer"]
    assert sgd["peak_memory_bytes"] < adam["peak_memory_bytes"]
    a, s = (plan(Request(model=f"{model_file}:make", gpus=2, input_shapes=((8, 128, 256),), dtypes=("bfloat16",),
                         optimizer=name, stages="off")).intra.problem for name in ("adam", "sgd"))
    assert set(a.optimizer) == set(s.optimizer) and len(a.optimizer) == 10  # 3 layers' and the head's weights, biases
    for key, seconds in a.optimizer.items():
        assert seconds == pytest.approx(28 / 12 * s.optimizer[key], rel=1e-12)
    assert (Accounting(a).state, Accounting(s).state) == (1 + 6, 1 + 2)  # the parameter and its state, per byte
    with pytest.raises(SpecError, match="optimizer='lion' must be one of adam, adamw"):
        plan(Request(model=f"{model_file}:make", optimizer="lion"))


def test_factory_plan_tables(model_file, capsys):
    _, out = run(["plan", "--model", f"{model_file}:make", "--input-shape", "64x128x256", "--dtype", "bfloat16",
                  "--system", "h100", "--gpus", "16", "--stages", "search", "--micro-batches", "4"], capsys)
    for text in ("step time", "memory per GPU", "parameters", "as PyTorch runs it", "collectives inserted",
                 "pipelines considered"):
        assert text in out


def test_preset_with_autoshard_finds_megatron_tensor_parallelism(capsys):
    """One 4096-token sequence on 8 GPUs: data parallelism has nothing to split, so the planner shards the layers:
    QKV and gate/up by columns, the output and down projections by rows, the norms along the sequence."""
    _, out = run(["plan", "--model", "llama3-8b", "--autoshard", "--system", "h100", "--gpus", "8",
                  "--global-batch", "1", "--seq", "4096", "--json"], capsys)
    data = json.loads(out)
    styles = {p["name"]: p["styles"][0] for p in data["parameters"]}
    assert styles["model.layers.*.self_attn.qkv_proj.weight"] == "ColwiseParallel"
    assert styles["model.layers.*.mlp.gate_up_proj.weight"] == "ColwiseParallel"
    assert styles["model.layers.*.self_attn.o_proj.weight"] == "RowwiseParallel"
    assert styles["model.layers.*.mlp.down_proj.weight"] == "RowwiseParallel"
    assert "SequenceParallel()" in data["parallelize_module"]
    assert data["layers"] == 32 and data["traced_layers"] == 2


def test_data_parallelism_is_in_the_program_beside_tensor_parallelism(capsys):
    """The audit's case: a sequence per GPU on 8 x 8; the layers replicate on the network and shard on NVLink
    (HSDP), the embedding and head are column-split. The program is one HSDP fully_shard over both dimensions
    (PyTorch composes no tensor parallelism on a dimension FSDP shards), and says what of the plan it leaves out.
    4096 tokens a sequence: at 8192, with mixed-precision Adam's 12 bytes of state a parameter (fp32 master and
    moments, memory.OPTIMIZER_STATE), the activations push the MLP's weights to be sharded on the network too."""
    _, out = run(["plan", "--model", "llama3-8b", "--autoshard", "--system", "h100", "--gpus", "64",
                  "--global-batch", "64", "--seq", "4096", "--json"], capsys)
    code = json.loads(out)["parallelize_module"]
    assert 'fully_shard(model, mesh=mesh["network", "nvlink"])' in code and code.count("fully_shard(model") == 1
    assert "parallelize_module(" not in code and "# not written: the plan's ColwiseParallel" in code
    compile(code, "plan", "exec")  # valid Python as printed


def test_config_json_with_autoshard(tmp_path, capsys):
    config = hf(tmp_path, LLAMA | {"num_hidden_layers": 4})
    _, out = run(["plan", "--model", config, "--autoshard", "--system", "h100", "--gpus", "4", "--global-batch",
                  "8", "--seq", "512", "--json"], capsys)
    data = json.loads(out)
    assert data["fits"] and data["layers"] == 4 and data["traced_layers"] == 2
    assert any(p["name"].startswith("model.layers.*.self_attn.q_proj") for p in data["parameters"])
    # the whole model's parameters, not the two traced layers' (issue 48: an 8B config.json read "1.49 B params"):
    # transformers' own count of the 4-layer model on the meta device
    transformers = pytest.importorskip("transformers")
    import torch

    with torch.device("meta"):
        hf_config = transformers.AutoConfig.from_pretrained(Path(config).parent)
        built = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert data["params"] == sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize("extra, words", [
    (["--zero", "1"], "--zero is an option of the template search"),
    (["--input-shape", "0x3"], "input-shape='0x3'"),
    (["--mesh", "3x3"], "mesh=3x3"),
    (["--micro-batches", "0"], "micro-batches=0"),
    (["--gpus", "8,16"], "one GPU count at a time"),
])
def test_bad_planner_options(model_file, capsys, extra, words):
    args = ["plan", "--model", f"{model_file}:make", "--input-shape", "4x8x256", "--dtype", "bfloat16", "--system",
            "h100", "--gpus", "8"]
    if extra[0] == "--gpus":
        args = args[:-2]
    assert words in fails([*args, *extra], capsys)


def test_planner_options_without_the_planner_are_refused(capsys):
    line = fails(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--micro-batches", "4"], capsys)
    assert "--micro-batches is an option of the sharding planner" in line


def test_factory_needs_its_input_shape(model_file, capsys):
    assert "input-shape is required" in fails(["plan", "--model", f"{model_file}:make", "--system", "h100",
                                               "--gpus", "8"], capsys)


def test_model_failing_on_its_inputs_is_one_line(model_file, capsys):
    line = fails(["plan", "--model", f"{model_file}:make", "--input-shape", "4x8x100", "--system", "h100",
                  "--gpus", "8"], capsys)
    assert "failed on input-shape=4x8x100" in line


def test_missing_scipy_names_the_extra(model_file, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy now fails as when it is not installed
    line = fails(["plan", "--model", f"{model_file}:make", "--input-shape", "4x8x256", "--system", "h100",
                  "--gpus", "8"], capsys)
    assert "scipy is not installed" in line and "meshplan[solve]" in line


def test_a_plan_that_cannot_fit_is_a_result_with_its_reason(capsys):
    """Llama-3-70B's parameters, gradients and Adam state alone are 8 bytes x 70.6 B = 565 GB: more than 8 GPUs
    hold at any split (70.6 GB each) beside activations."""
    _, out = run(["plan", "--model", "llama3-70b", "--autoshard", "--system", "h100", "--gpus", "8",
                  "--global-batch", "8", "--seq", "4096", "--json"], capsys)
    data = json.loads(out)
    assert not data["fits"] and data["step_time_s"] is None and "no plan fits" in data["reason"]
