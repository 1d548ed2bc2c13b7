"""The planner's printed program runs as printed: each test plans a model (tests/shardrun_models.py, or the
audit's transformer of nn.TransformerEncoderLayer), then spawns one gloo process per rank of the plan's mesh on
this CPU, builds the small model of the same modules, executes the printed code (``"cuda"`` read as ``"cpu"``),
runs a forward and backward pass on the rank's share of the batch (its coordinate on the data-parallel
dimensions the code names), and checks the loss and every parameter's gradient (a DTensor's gathered whole)
against the unsharded model's: the loss of the same share, the gradients of the mean of the shares' losses (what
data parallelism averages)."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import sys
import tempfile
from datetime import timedelta
from fnmatch import fnmatch
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")

from meshplan.autoshard.planner import Request, plan_sharding  # noqa: E402
from meshplan.autoshard.program import parallelize_code  # noqa: E402
from meshplan.calibrate.ranks import start_ranks  # noqa: E402

MODELS = str(Path(__file__).with_name("shardrun_models.py"))
AUDIT = '''
import torch, torch.nn as nn
class M(nn.Module):
    def __init__(s, d=256):
        super().__init__()
        s.emb = nn.Embedding(1000, d)
        s.l = nn.ModuleList([nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True) for _ in range(2)])
        s.h = nn.Linear(d, 1000)
    def forward(s, x):
        h = s.emb(x)
        for l in s.l: h = l(h)
        return s.h(h).float().logsumexp(-1).mean()
def make_model(): return M()
def make_small(): return M(32)
'''


def _factory(ref: str):
    path, name = ref.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _inputs(kind: str, slices: int):
    gen = torch.Generator().manual_seed(1)
    if kind.startswith("tokens"):
        return torch.randint(0, 1000 if kind == "tokens_audit" else 64, (slices, 2, 16), generator=gen)
    return torch.randn(slices, 4, 3, 8, 8, generator=gen)


def _dp_names(code: str) -> list[str]:
    """The mesh dimensions the code's fully_shard / replicate line names, outermost first."""
    found = re.search(r'^(?:fully_shard\(model, mesh|replicate\(model, device_mesh)=mesh\[([^\]]+)\]', code, re.M)
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def _rank(rank: int, world: int, rendezvous: str, code: str, small: str, kind: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = _factory(small)()
        ref = copy.deepcopy(model)
        space = {"model": model}
        exec(code.replace('"cuda"', '"cpu"'), space)  # noqa: S102 - the program under test, as printed
        mesh, index, slices = space["mesh"], 0, 1
        for name in _dp_names(code):
            index, slices = index * mesh[name].size() + mesh[name].get_local_rank(), slices * mesh[name].size()
        x = _inputs(kind, slices)
        loss = model(x[index])
        loss.backward()
        losses = [ref(x[i]) for i in range(slices)]
        torch.stack(losses).mean().backward()
        torch.testing.assert_close(loss.detach(), losses[index].detach(), rtol=1e-4, atol=1e-5)
        grads = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            g = _unpacked(g, name, space.get("packed", {}), space.get("tp", 1))
            torch.testing.assert_close(g, grads[name].grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        dist.destroy_process_group()


def _unpacked(grad, name: str, packed: dict[str, int], tp: int):
    """A packed fused projection's gradient (the program's ``packed``: rank r's rows its share of every part) in the
    unsharded model's row order."""
    for pattern, parts in packed.items():
        if fnmatch(name.rsplit(".", 1)[0], pattern):
            return grad.unflatten(0, (tp, parts, -1)).transpose(0, 1).flatten(0, 2)
    return grad


def execute(code: str, world: int, small: str, kind: str) -> None:
    with tempfile.TemporaryDirectory(prefix="meshplan-run-") as tmp:
        start_ranks(_rank, (world, os.path.join(tmp, "rendezvous"), code, small, kind), world, "cpu")


def planned(model: str, gpus: int, shape: tuple[int, ...], mesh=None, dtype: str = "int64", headroom: float = 0.0
            ) -> str:
    result = plan_sharding(Request(model=model, gpus=gpus, mesh=mesh, input_shapes=(shape,), dtypes=(dtype,),
                                   stages="off", headroom=headroom))
    return parallelize_code(result.intra)


@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("audit") / "mm.py"
    path.write_text(AUDIT)
    return str(path)


def test_tensor_parallel_transformer_on_a_1d_mesh():
    """One 4096-token sequence of a 4096-wide model on 2 GPUs: the planner splits the layers (Megatron's pairs)."""
    code = planned(f"{MODELS}:make_lm_plan", 2, (1, 4096))
    assert 'parallelize_module(model, mesh["nvlink"]' in code and '"layers.*.mlp.up": ColwiseParallel()' in code
    assert "fully_shard" not in code and "replicate(" not in code  # one sequence: nothing to split by batch
    execute(code, 2, f"{MODELS}:make_lm", "tokens")


def test_tensor_and_data_parallel_transformer_on_a_2d_mesh():
    """Two sequences on a 2 x 2 mesh: tensor parallel on one dimension, data parallel on the other, composed as
    torchtitan does (parallelize_module, then fully_shard on the other dimension of the same mesh). (At four
    sequences the planner's best mixes styles per tensor within 0.3 % of such a plan, which no program writes.)"""
    code = planned(f"{MODELS}:make_lm_plan", 4, (2, 4096), mesh=(2, 2))
    tp = re.search(r'parallelize_module\(model, mesh\["(\w+)"\]', code)
    dp = _dp_names(code)
    assert tp and dp and tp.group(1) not in dp
    assert code.index("parallelize_module(") < code.index(dp[0] + '"])')  # TP first, then data parallelism
    execute(code, 4, f"{MODELS}:make_lm", "tokens")


def test_hsdp_is_one_fully_shard_over_a_2d_mesh(audit):
    """The audit's case: sharded on one dimension, replicated on the other. PyTorch refuses replicate() on a module
    fully_shard manages; HSDP is one fully_shard over (replicate, shard). Priced on the GPU alone (host_dispatch 0:
    the host's launches of this small model would tie plans that write different programs at its time). With the
    whole HBM the plan replicates on both (2.051 ms; its 249 MB per GPU fit); 240 MB per GPU (the headroom leaves them
    of the H100's 85.5 GB) makes it shard one dimension (2.062 ms), every parameter as the program writes it."""
    result = plan_sharding(Request(model=f"{audit}:make_model", gpus=4, mesh=(2, 2), input_shapes=((64, 512),),
                                   dtypes=("int64",), stages="off", headroom=1 - 240e6 / 85_520_809_984,
                                   host_dispatch=0.0))
    code = parallelize_code(result.intra)
    assert code.count("fully_shard(model") == 1 and "replicate(model" not in code and "# not written" not in code
    execute(code, 4, f"{audit}:make_small", "tokens_audit")


def test_a_chunked_fused_projection_is_packed():
    """``gate_up_proj`` chunked into gate and up: ColwiseParallel's contiguous rows gave rank 0 all of gate and
    rank 1 all of up, so silu(gate) * up was silu(gate) * gate on rank 0 (wrong loss, no error). Packed rows give
    each rank its 4 * 32 / 2 = 64 rows of gate and of up."""
    code = planned(f"{MODELS}:make_gated_plan", 2, (1, 4096))
    assert 'packed = {"layers.*.mlp.gate_up_proj": 2}' in code
    assert '"layers.*.mlp.down_proj": RowwiseParallel(' in code and "not written" not in code
    execute(code, 2, f"{MODELS}:make_gated", "tokens")


def test_a_fused_projection_split_by_whole_widths_is_gathered():
    """meshplan's preset layers (torch_models.py): ``qkv_proj`` split into q, k, v by the whole tensor's widths
    (32 + 16 + 16 = 64 of a rank's 32 columns: an error), ``gate_up_proj`` chunked. qkv_proj gathers its output and
    o_proj slices its input (as transformers' Phi-3 plan), gate_up_proj is packed; the comment says so. (A sequence of
    2048 tokens: at 4096 the plan no longer splits qkv_proj's input by the sequence.)"""
    code = planned(f"{MODELS}:make_fused_plan", 2, (1, 2048))
    assert '"model.layers.*.self_attn.qkv_proj": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())' \
        in code and "# not written as planned: the plan's split of model.layers.*.self_attn.qkv_proj" in code
    assert '"model.layers.*.self_attn.o_proj": RowwiseParallel(input_layouts=Replicate(), ' in code
    assert 'packed = {"model.layers.*.mlp.gate_up_proj": 2}' in code
    execute(code, 2, f"{MODELS}:make_fused", "tokens")


def test_cnn_is_data_parallel_where_pytorch_has_no_style_for_a_channel_split():
    code = planned(f"{MODELS}:make_cnn_plan", 2, (512, 3, 64, 64), dtype="bfloat16")
    """The audit's case: the convolution's output channels were planned ColwiseParallel, which PyTorch refuses for
    an nn.Conv2d; the rules now split a convolution by its batch only, and the plan is data parallel."""
    assert '"c.0"' not in code and _dp_names(code) == ["nvlink"]
    execute(code, 2, f"{MODELS}:make_cnn", "images")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
