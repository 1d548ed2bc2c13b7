"""Tracing arbitrary nn.Modules: FLOPs against FlopCounterMode and closed forms, liveness peak against a hand
count, the saved-tensor hooks and a real CPU run's allocator, the CLI."""

from __future__ import annotations

import json
import math
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from meshplan.cli import main  # noqa: E402
from meshplan.roofline import op_time  # noqa: E402
from meshplan.specs.hardware import load_system  # noqa: E402
from meshplan.trace import op_cost, peak_memory, time_traced_ops, trace_module  # noqa: E402
from meshplan.trace.cost import precision  # noqa: E402

B, S, C, A, L, V = 2, 32, 64, 4, 2, 128  # batch, sequence, hidden, heads, layers, vocabulary


# ---- a nanoGPT-style model (Karpathy's model.py, trimmed) ----------------------------------------------------
class Attention(nn.Module):
    def __init__(self, flash: bool):
        super().__init__()
        self.c_attn, self.c_proj, self.flash = nn.Linear(C, 3 * C), nn.Linear(C, C), flash
        self.register_buffer("bias", torch.tril(torch.ones(S, S)).view(1, 1, S, S))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = (y.view(b, t, A, c // A).transpose(1, 2) for y in self.c_attn(x).split(C, dim=2))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # nanoGPT's fallback: the scores as batched GEMMs, masked, softmax
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, flash: bool):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), Attention(flash), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, flash: bool = True):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(S, C)
        self.h = nn.ModuleList(Block(flash) for _ in range(L))
        self.ln_f, self.lm_head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as in GPT-2

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@pytest.fixture(scope="module", params=[True, False], ids=["sdpa", "manual"])
def gpt(request):
    torch.manual_seed(0)
    model = GPT(flash=request.param)
    return model, trace_module(model, [((B, S), "int64")])


# ---- FLOPs ----------------------------------------------------------------------------------------------------
def test_linear_gemm_flops_are_2_b_in_out():
    b, d_in, d_out = 6, 48, 80
    tr = trace_module(nn.Linear(d_in, d_out), [((b, d_in), "float32")])
    (fwd,) = [op for op in tr.ops if op.kind == "gemm" and op.phase == "fwd"]
    assert fwd.target == "aten.addmm.default"
    assert fwd.flops == 2 * b * d_in * d_out == 46_080  # 2 * 6 * 48 * 80; the bias add is not a GEMM FLOP
    assert (fwd.m, fwd.k, fwd.n) == (b, d_in, d_out)
    # the input needs no gradient: the backward pass is only the weight-gradient GEMM (and the bias sum)
    (wgrad,) = [op for op in tr.ops if op.kind == "gemm" and op.phase != "fwd"]
    assert wgrad.phase == "bwd_w" and wgrad.flops == 46_080
    assert [op.phase for op in tr.ops if op.target == "aten.sum.dim_IntList"] == ["bwd_w"]


def test_gpt_flops_equal_flop_counter_mode(gpt):
    """Method 1: FlopCounterMode on a real CPU forward + backward. Method 2: the trace's per-op sum."""
    from torch.utils.flop_counter import FlopCounterMode

    model, tr = gpt
    with FlopCounterMode(display=False) as counter:
        loss = model(torch.randint(0, V, (B, S))).sum()
        torch.autograd.grad(loss, list(model.parameters()))
    assert tr.flops(source="flop_counter") == counter.get_total_flops()
    # flop_counter has no formula for the CPU flash kernel; the trace counts it with flop_counter's sdpa formula
    cpu_sdpa = tr.flops(source="meshplan", kind="attention")
    assert cpu_sdpa == (3.5 * 4 * B * S * S * C * L if model.h[0].attn.flash else 0)  # forward 1 + backward 2.5


def test_gpt_forward_flops_match_the_closed_form(gpt):
    model, tr = gpt
    tokens = B * S
    # GEMM weights: per layer qkv 3C² + out C² + MLP 8C², and the LM head V·C (the tied embedding is a gather)
    gemm_weights = L * 12 * C * C + V * C  # 2 * 12 * 4096 + 128 * 64 = 106_496
    assert gemm_weights == sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    attention = 4 * B * S * S * C * L  # QKᵀ and PV: 2 GEMMs × 2·B·S·S·C per layer = 1_048_576
    # exact: the Linear GEMMs 2·106_496·64 = 13_631_488 + the score GEMMs (bmm, or inside the fused kernel)
    assert tr.flops("fwd", kind="gemm") + tr.flops("fwd", kind="attention") == 2 * gemm_weights * tokens + attention
    # with every parameter (embeddings, norms, biases) and the element-wise ops: within 5 %
    params = sum(p.numel() for p in model.parameters())
    assert tr.params == params == 110_336
    closed = 2 * params * tokens + attention  # 2 * 110_336 * 64 + 1_048_576 = 15_171_584
    assert tr.flops("fwd") == pytest.approx(closed, rel=0.05)


def test_backward_gemms_are_twice_the_forward(gpt):
    model, tr = gpt
    fwd = tr.flops("fwd", kind="gemm")
    assert tr.flops("bwd", kind="gemm") == 2 * fwd  # input gradient + weight gradient, each = forward
    # 9 Linear layers (4 per block + LM head): one weight-gradient GEMM each, as many FLOPs as their forward
    linear = 2 * (L * 12 * C * C + V * C) * B * S  # 2 * 106_496 * 64 = 13_631_488
    wgrad = [op for op in tr.ops if op.kind == "gemm" and op.phase == "bwd_w"]
    assert len(wgrad) == 4 * L + 1 and tr.flops("bwd_w", kind="gemm") == linear
    # input gradients: the Linear layers' + (manual attention) both operands of the 2 score GEMMs per layer:
    # dP = dY·Vᵀ, dV = Pᵀ·dY, dS·K, dSᵀ·Q = 2 × the forward's QKᵀ and PV (there is no weight there)
    scores = fwd - linear  # 0 with the fused kernel; 4·B·S·S·C·L = 1_048_576 with the manual path
    assert scores == (0 if model.h[0].attn.flash else 4 * B * S * S * C * L)
    assert tr.flops("bwd_x", kind="gemm") == linear + 2 * scores
    attention = tr.flops("fwd", kind="attention")
    assert tr.flops("bwd", kind="attention") == 2.5 * attention  # flop_counter: 5 GEMMs backward vs 2 forward


def test_ops_are_named_by_module_and_costed(gpt):
    _, tr = gpt
    names = {op.name for op in tr.ops}
    assert {"h.0.attn.c_attn/addmm", "h.1.mlp.0/addmm", "lm_head/mm", "loss/sum"} <= names
    assert any(op.name == "h.0.mlp.0/mm" and op.phase == "bwd_w" for op in tr.ops)
    h100 = load_system("h100").accelerator
    timed = time_traced_ops(tr, h100)
    from meshplan.specs.efficiency import DEFAULT

    for t in timed:  # every kernel is timed by roofline.op_time on its OpCost, at its operands' precision
        assert t.seconds == op_time(op_cost(t.op), h100, precision(t.op), DEFAULT)
        assert t.seconds > 0 or t.op.nbytes == t.op.flops == 0
    assert {t.cost.kind for t in timed} >= {"gemm", "memory"}
    assert len(timed) == sum(1 for op in tr.ops if op.kind != "view")


def test_bf16_weights_halve_parameter_bytes_and_run_faster():
    model = GPT()
    fp32 = trace_module(model, [((B, S), "int64")])
    bf16 = trace_module(model, [((B, S), "int64")], param_dtype="bfloat16")
    assert fp32.param_bytes == 4 * 110_336 and bf16.param_bytes == 2 * 110_336
    assert bf16.flops() == fp32.flops()
    h100 = load_system("h100").accelerator
    assert sum(t.seconds for t in time_traced_ops(bf16, h100)) < sum(t.seconds for t in time_traced_ops(fp32, h100))


# ---- liveness ---------------------------------------------------------------------------------------------------
def test_liveness_peak_of_a_chain_by_hand():
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 8, bias=False))
    tr = trace_module(chain, [((4, 16), "float32")])
    mem = peak_memory(tr, optimizer="none")
    # persistent: W1 16·32·4 = 2048, W2 32·8·4 = 1024, x 4·16·4 = 256 → 3328 (the t() views add nothing)
    assert mem.timeline[0] == 3328
    # forward, second GEMM y = r·W2ᵀ: 3328 + relu output r 4·32·4 = 512 (saved for threshold_backward) + y 4·8·4
    # = 128 → 3968; the pre-ReLU h (512) died after the ReLU read it (ReLU's backward uses its output)
    (mm2,) = [op for op in tr.ops if op.name == "2/mm" and op.phase == "fwd"]
    assert mem.timeline[mm2.index] == 3328 + 512 + 128 == 3968
    # peak: the first layer's weight-gradient GEMM dW1 = gᵀ·x: dW2 32·8·4 = 1024 (kept), dW1 2048 (made here),
    # g = ReLU's input gradient 4·32·4 = 512 (read here for the last time) → 3328 + 1024 + 2048 + 512 = 6912
    assert mem.peak == 6912 and mem.op_name == "0/mm" and mem.phase == "bwd_w"
    assert mem.breakdown == {"optimizer": 0, "param": 3072, "input": 256, "grad": 3072, "temporary": 512}
    # Adam keeps exp_avg and exp_avg_sq: + 2 · 3072 at every op
    assert peak_memory(tr, optimizer="adam").peak == 6912 + 2 * 3072


def test_optimizer_state_is_the_one_tables():
    """memory.OPTIMIZER_STATE's K bytes a parameter (Adam 12: fp32 master 4 + two fp32 moments 8), per parameter
    byte: at fp32 torch.optim's in place (the parameter is its own master: (12 - 4) / 4 = 2 x its bytes), beside bf16
    parameters mixed precision's (12 / 2 = 6 x); ``momentum`` is sgd-momentum; a name outside the table: one line."""
    from meshplan.errors import SpecError

    chain = nn.Sequential(nn.Embedding(16, 32), nn.Linear(32, 8, bias=False))  # 16·32 + 32·8 = 768 parameters
    fp32 = trace_module(chain, [((4,), "int64")])
    bf16 = trace_module(chain, [((4,), "int64")], param_dtype="bfloat16")
    assert (fp32.params, fp32.param_bytes, bf16.param_bytes) == (768, 4 * 768, 2 * 768)

    def state(trace, name, master=None):
        return peak_memory(trace, name, master).breakdown["optimizer"]

    assert state(fp32, "adam") == 2 * 4 * 768 and state(fp32, "sgd") == state(fp32, "none") == 0
    assert state(fp32, "momentum") == state(fp32, "sgd-momentum") == 4 * 768
    assert state(fp32, "adam-8bit") == int((6.03125 - 4) * 768)  # two 1-byte moments and their block scales
    assert state(bf16, "adam") == 12 * 768 and state(bf16, "sgd") == 4 * 768  # the fp32 master copy beside
    assert state(bf16, "adam", master=False) == 2 * 2 * 768  # torch.optim.Adam on the bf16 model: bf16 moments
    assert peak_memory(bf16, "adam").peak - peak_memory(bf16, "none").peak == 12 * 768
    with pytest.raises(SpecError, match="optimizer='lion' must be one of adam, adamw, adam-bf16"):
        peak_memory(fp32, "lion")


def test_saved_activations_equal_the_saved_tensor_hooks(gpt):
    """Method 2: count the storages autograd saves (torch.autograd.graph.saved_tensors_hooks) in a real run."""
    model, tr = gpt
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}
    keep = []

    def pack(t):
        keep.append(t)
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    idx = torch.randint(0, V, (B, S))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx)
    # the hooks also see the token ids (the embedding saves them; the trace counts them as the input) and the
    # trace also keeps the 4-byte loss, which the backward pass reads first
    assert peak_memory(tr).saved == sum(saved.values()) - idx.nbytes + 4


def test_liveness_peak_matches_the_cpu_allocator(gpt):
    """Method 2: a real CPU forward + backward under the profiler's memory timeline (every allocation and free
    the CPU allocator saw, parameters and inputs included). Eager PyTorch frees a tensor when its last reference
    goes, not at its last use, so it can only be higher; it is within 1.5 % here."""
    mp = pytest.importorskip("torch.profiler._memory_profiler")
    from torch.profiler import ProfilerActivity, profile

    model, tr = gpt
    idx = torch.randint(0, V, (B, S))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as p:
        loss = model(idx).sum()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        del loss, grads
    live = peak = 0
    for _, action, _, size in p._memory_profile().timeline:
        live += size if action in (mp.Action.PREEXISTING, mp.Action.CREATE) else (
            -size if action == mp.Action.DESTROY else 0)
        peak = max(peak, live)
    assert peak == pytest.approx(peak_memory(tr, optimizer="none").peak, rel=0.015)


def test_gpt_peak_is_in_the_backward_pass(gpt):
    _, tr = gpt
    mem = peak_memory(tr)
    assert mem.phase in ("bwd_x", "bwd_w") and mem.peak == max(mem.timeline)
    assert mem.breakdown["param"] == tr.param_bytes == 4 * 110_336
    assert mem.breakdown["optimizer"] == 2 * tr.param_bytes
    assert sum(mem.breakdown.values()) == mem.peak


def test_views_and_in_place_ops_share_their_storage():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x).view(2, 2, 8)
            y += x.view(2, 2, 8)  # in place on the GEMM's result
            return y.transpose(0, 1)

    tr = trace_module(Residual(), [((4, 8), "float32")])
    (gemm,) = [op for op in tr.ops if op.target == "aten.addmm.default"]
    (add_,) = [op for op in tr.ops if op.target == "aten.add_.Tensor"]
    assert add_.outputs[0].storage == add_.inputs[0].storage == gemm.outputs[0].storage
    assert add_.bytes_written == 4 * 8 * 4  # it writes, but allocates nothing
    # forward allocations: the GEMM result (128 B) and the 4-byte loss; views and add_ add no storage
    assert sorted(s.nbytes for s in tr.storages.values() if s.role == "activation") == [4, 128]


def test_value_dependent_control_flow_is_a_clear_error():
    from meshplan.errors import SpecError

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) if x.sum() > 0 else self.lin(-x)

    with pytest.raises(SpecError, match="depend on tensor values"):
        trace_module(Branchy(), [((2, 4), "float32")])


def test_a_frozen_model_is_traced_forward_only():
    tr = trace_module(nn.Linear(8, 8).requires_grad_(False), [((2, 8), "float32")])
    assert {op.phase for op in tr.ops} == {"fwd"} and tr.bytes_of("grad") == 0
    assert tr.flops() == 2 * 2 * 8 * 8


# ---- CLI --------------------------------------------------------------------------------------------------------
MODEL_FILE = """
import torch.nn as nn

def make():
    return nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 100))
"""


def test_cli_trace_json(tmp_path, capsys):
    path = tmp_path / "tiny.py"
    path.write_text(MODEL_FILE)
    code = main(["trace", f"{path}:make", "--input-shape", "4x16", "--system", "h100", "--json", "--top", "5"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["params"] == 100 * 32 + 32 * 64 + 64 + 64 * 100 + 100
    assert data["flops"]["total"] > 0 and data["time_s"]["total"] > 0 and len(data["top_ops"]) == 5
    assert data["peak_memory_bytes"] == sum(data["memory_breakdown"].values())
    assert 0 < sum(op["share"] for op in data["top_ops"]) <= 1
    assert data["peak_op"]["phase"].startswith("bwd")


def test_cli_trace_table_from_an_importable_module(tmp_path, capsys, monkeypatch):
    (tmp_path / "tinymodel.py").write_text(MODEL_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["trace", "tinymodel:make", "--input-shape", "4x16", "--system", "a100", "--top", "3"])
    out = capsys.readouterr().out
    assert code == 0 and "peak memory" in out and "top 3 ops by time" in out and "share" in out


@pytest.mark.parametrize(("args", "message"), [
    (["nosuch_module_xyz:make", "--input-shape", "2x32"], "model='nosuch_module_xyz:make': no module named"),
    (["tinymodel:make", "--input-shape", "2xk"], "input-shape='2xk' must be positive integers"),
    (["tinymodel:nothing", "--input-shape", "2x3"], "has no attribute 'nothing'"),
    (["tinymodel", "--input-shape", "2x3"], "must be MODULE:FACTORY"),
    (["tinymodel:make", "--input-shape", "2x3", "--dtype", "int13"], "dtype='int13' is not a torch dtype"),
    (["tinymodel:make", "--input-shape", "2x3", "--dtype", "float32"], "failed on input-shape=2x3"),
    (["tinymodel:make", "--input-shape", "2x3", "--param-dtype", "bf17"], "param-dtype='bf17' is not a torch dtype"),
    (["tinymodel:make", "--input-shape", "2x3", "--dtype", "int64", "--dtype", "int64"],
     "--dtype int64 --dtype int64: give one --dtype or one per --input-shape (1 inputs)"),
    (["raising:make", "--input-shape", "2x3"], "model='raising:make': importing raising failed: RuntimeError: boom"),
    (["linear:make", "--input-shape", "2x4", "--dtype", "int64"],
     "addmm of float32 and int64 and float32: expected one dtype"),
    (["exiting:make", "--input-shape", "2x3"], "importing exiting called sys.exit(3); guard its script code"),
    (["nofile.py:make", "--input-shape", "2x3"], "model='nofile.py:make': no such file 'nofile.py'"),
    (["tinymodel:make", "--input-shape", "2x3", "--optimizer", "lion"],
     "optimizer='lion' must be one of adam, adamw, adam-bf16, adam-8bit, sgd-momentum, sgd, adafactor, none"),
])
def test_cli_trace_bad_input_is_one_line(args, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "tinymodel.py").write_text(MODEL_FILE)
    (tmp_path / "raising.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "exiting.py").write_text("import sys\n\nsys.exit(3)\n")  # a script: it used to end meshplan silently
    # an int64 input (the default dtype) fed to a Linear: eager PyTorch rejects it, fake tensors alone would not
    (tmp_path / "linear.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = main(["trace", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "failed: SpecError" not in err, err


def test_cli_trace_without_torch_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ModuleNotFoundError
    code = main(["trace", "tinymodel:make", "--input-shape", "2x3"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'meshplan[torch]'" in err and err.count("\n") == 1
