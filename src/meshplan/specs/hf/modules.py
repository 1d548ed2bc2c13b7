"""Reading one decoder layer of a model built on the meta device (meta.py): which blocks it holds and their
sizes, from its modules' names and weight shapes, for the generic reader (generic.py).

A layer is split into blocks by the modules that hold them (the names used across transformers' ``modeling_*.py``):

    attention   a module with q/k/v/out projections (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``; GPT-2's
                ``c_attn`` / ``c_proj`` Conv1D; fused ``qkv_proj``, ``query_key_value``, ``Wqkv``), per-head or
                whole-width q/k norms (``q_norm``), attention sinks (GPT-OSS ``sinks``), an output gate (a
                q_proj twice o_proj's input, Qwen3-Next; a ``gate_proj`` H → A·d, AFMoE), a per-head gate
                (Laguna's ``g_proj`` H → A), differential attention's λ vectors (DiffLlama ``lambda_q1`` …)
    MLA         ``kv_a_proj_with_mqa`` / ``kv_b_proj`` (DeepSeek-V2/V3 §2.1): sizes from the config; DeepSeek
                Sparse Attention's ``indexer`` (indexer.py), a per-head ``g_proj``, a RoPE-key norm
    KDA, …      Kimi Delta Attention, lightning attention, RG-LRU, LFM2's short convolution (linear.py)
    Mamba-2     a module with ``A_log`` (one per head), ``D``, ``dt_bias``, ``in_proj``, ``conv1d``, ``norm``,
                ``out_proj`` (Dao & Gu 2024; models/mamba2/modeling_mamba2.py)
    GDN         Gated DeltaNet: ``A_log``, ``dt_bias``, ``in_proj_*`` projections, ``conv1d``, ``norm``,
                ``out_proj`` (Yang et al. 2024; models/qwen3_next/modeling_qwen3_next.py)
    MoE         a module with ``experts`` (fused 3-D expert tensors or a list of MLPs), a router weight (E, H)
                (+ bias or score-correction bias), shared experts (``shared_expert(s)``) and their gate (1, H)
    MLP         up / gate / down projections (``up_proj``, ``gate_proj``, ``down_proj``; ``fc1`` / ``fc2``;
                ``c_fc`` / ``c_proj``; ``dense_h_to_4h`` / ``dense_4h_to_h``; fused ``gate_up_proj``)
    norms       H-wide norm modules of the layer itself (pre-norms, post-norms)

Anything else is ``unclaimed``: a structure meshplan does not model, which the reader refuses naming it (RWKV, xLSTM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.specs.hf.indexer import read_indexer
from meshplan.specs.hf.linear import LINEAR_READERS, linear_kind
from meshplan.specs.hf.moa import is_fused_moe, is_moa, read_fused_moe, read_moa

Q, K, V = ("q_proj", "query", "wq", "project_q", "Wq"), ("k_proj", "key", "wk", "project_k", "Wk"), \
    ("v_proj", "value", "wv", "project_v", "Wv")
QKV = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "W_pack", "wqkv", "qkv")
OUT = ("o_proj", "dense", "out_proj", "wo", "c_proj", "attention_out", "o", "Wo")
UP = ("up_proj", "fc1", "c_fc", "fc_in", "dense_h_to_4h", "w3", "linear_fc1", "gate_up_proj", "input_linear", "Wi")
GATE = ("gate_proj", "w1")
DOWN = ("down_proj", "fc2", "c_proj", "fc_out", "dense_4h_to_h", "w2", "linear_fc2", "output_linear", "Wo")
QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"))
MAMBA2 = {"A_log", "D", "dt_bias", "in_proj.weight", "conv1d.weight", "conv1d.bias", "norm.weight",
          "out_proj.weight"}


@dataclass
class LayerBlocks:
    """What one decoder layer holds: ``blocks`` in order ("attention", "mla", "mamba", "mlp", "moe") with the
    sizes read from each (``sizes[kind]``), the widths and biases of its own norms, and the parameters no block
    claims."""

    blocks: list[str] = field(default_factory=list)
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    norms: list[tuple[int, bool, str]] = field(default_factory=list)  # (width, bias, class name)
    unclaimed: list[str] = field(default_factory=list)


def linear(module: Any) -> tuple[int, int, bool] | None:
    """(out, in, bias) of a linear layer (nn.Linear, or transformers' Conv1D whose weight is stored (in, out))."""
    weight = getattr(module, "weight", None)
    if weight is None and set(children(module)) == {"linear"}:  # a wrapper holding its nn.Linear (Moshi's MoshiLinear)
        return linear(children(module)["linear"])
    if weight is None or weight.dim() != 2:
        return None
    out, inp = weight.shape
    if type(module).__name__ == "Conv1D":
        out, inp = inp, out
    return int(out), int(inp), getattr(module, "bias", None) is not None


def children(module: Any) -> dict[str, Any]:
    return dict(module.named_children())


def kind_of(module: Any) -> str | None:
    """The block a module is, by its children and own parameters (the module docstring's table), else None."""
    kids, own = children(module), dict(module.named_parameters(recurse=False))
    if (linear_kind_ := linear_kind(module)) is not None:  # Kimi Delta Attention, lightning attention (linear.py)
        return linear_kind_
    if "A_log" in own:
        if own["A_log"].dim() == 2 and "x_proj" in kids:  # Mamba-1: A of shape (D_i, N)
            return "mamba1"
        return "deltanet" if any(k.startswith("in_proj_") or k == "q_proj" for k in kids) else "mamba"
    if "kv_a_proj_with_mqa" in kids or "kv_b_proj" in kids:
        return "mla"
    if is_moa(module):  # JetMoE's mixture of attention heads (moa.py)
        return "attention"
    if "experts" in kids or is_fused_moe(module):
        return "moe"
    has = set(kids)
    if (has & set(Q) and has & set(K) or has & set(QKV)) and has & set(OUT):
        return "attention"
    if has & set(UP) and has & set(DOWN) or _sequential(module):
        return "mlp"
    return None


def _sequential(module: Any) -> tuple[tuple[str, tuple[int, int, bool]], tuple[str, tuple[int, int, bool]]] | None:
    """An nn.Sequential MLP: two linear layers with parameter-free modules (the activation) between them (CTRL's
    ffn = Sequential(Linear, ReLU, Linear)), as (name, shape) of its up and down projections."""
    if type(module).__name__ != "Sequential":
        return None
    kids = children(module)
    linears = [(n, shape) for n, kid in kids.items() if (shape := linear(kid)) is not None]
    others = [kid for n, kid in kids.items() if n not in dict(linears)]
    if len(linears) != 2 or any(list(kid.parameters()) for kid in others):
        return None
    return linears[0], linears[1]


def read_layer(layer: Any, hidden: int) -> LayerBlocks:
    """Split one decoder layer into its blocks, norms and unclaimed parameters."""
    out = LayerBlocks()
    claimed: list[str] = []
    for name, module in layer.named_modules():
        if any(name == c or name.startswith(c + ".") for c in claimed) or not name:
            continue
        kind = kind_of(module)
        if kind is not None:
            claimed.append(name)
            sizes, rest = READERS[kind](module, hidden)
            out.blocks.append(kind)
            out.sizes.setdefault(kind, sizes)
            out.unclaimed += [f"{name}.{r}" for r in rest]
        elif "norm" in type(module).__name__.lower() and not children(module):
            claimed.append(name)
            weight = getattr(module, "weight", None)
            width = int(weight.shape[0]) if weight is not None else 0
            if width not in (0, hidden):
                out.unclaimed.append(f"{name} ({type(module).__name__} of width {width})")
            out.norms.append((width, getattr(module, "bias", None) is not None, type(module).__name__))
    _root_mlp(layer, hidden, claimed, out)
    # in the order a pre-norm layer runs them: the mixer, then the feed-forward block (registration order varies)
    out.blocks.sort(key=lambda kind: kind in ("mlp", "moe"))
    if "moe" in out.blocks and "mlp" in out.blocks and "shared" not in out.sizes["moe"]:
        # an MLP beside the routed experts on the same input, summed with them (GraniteMoeHybrid's shared_mlp):
        # a shared expert
        out.blocks.remove("mlp")
        out.sizes["moe"]["shared"] = out.sizes.pop("mlp")
    for name, p in layer.named_parameters():
        if not any(name.startswith(c + ".") for c in claimed):
            out.unclaimed.append(f"{name} {tuple(p.shape)}")
    return out


def _root_mlp(layer: Any, hidden: int, claimed: list[str], out: LayerBlocks) -> None:
    """An MLP whose projections are the layer's own children (OPT's and XGLM's fc1 / fc2)."""
    up, down = _take(layer, UP), _take(layer, DOWN)
    if up is None or down is None or up[0] in claimed or down[0] in claimed or "mlp" in out.blocks:
        return
    sizes, _ = _mlp(layer, hidden)
    gate = _take(layer, GATE)
    claimed += [up[0], down[0]] + ([gate[0]] if gate else [])
    out.blocks.append("mlp")
    out.sizes.setdefault("mlp", sizes)


def _take(module: Any, names: tuple[str, ...]) -> tuple[str, tuple[int, int, bool]] | None:
    kids = children(module)
    for n in names:
        if n in kids and (shape := linear(kids[n])) is not None:
            return n, shape
    return None


def _rest(module: Any, used: set[str]) -> list[str]:
    """The parameters of ``module`` not under the children / own names in ``used``."""
    return [f"{n} {tuple(p.shape)}" for n, p in module.named_parameters() if n.split(".")[0] not in used]


def _attention(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """q, k, v and out widths and biases, q/k norm widths, sinks (a mixture of attention heads: moa.py)."""
    if is_moa(module):
        return read_moa(module, hidden)
    used: set[str] = set()
    sizes: dict[str, Any] = {}
    fused = _take(module, QKV)
    if fused:
        used.add(fused[0])
        sizes.update(qkv=fused[1][0], qkv_bias=fused[1][2])
    else:
        for key, names in (("q", Q), ("k", K), ("v", V)):
            got = _take(module, names)
            if got:
                used.add(got[0])
                sizes[key], sizes[key + "_bias"] = got[1][0], got[1][2]
    out = _take(module, OUT)
    if out:
        used.add(out[0])
        sizes.update(o_in=out[1][1], o_bias=out[1][2])
    kids = children(module)
    for qn, kn in QK_NORMS:
        if qn in kids and kn in kids:
            used |= {qn, kn}
            sizes["q_norm"], sizes["k_norm"] = (_width(kids[qn]), _width(kids[kn]))
    gate = kids.get("gate_proj")  # a separate output-gate projection H → A·d (AFMoE: output * sigmoid(gate_proj(x)))
    if gate is not None and out and linear(gate) == (out[1][1], hidden, False):
        used.add("gate_proj")
        sizes["gate"] = True
    head_gate = linear(kids["g_proj"]) if "g_proj" in kids else None  # Laguna's: H → A·d, or H → A (per head)
    if head_gate is not None and out and head_gate[1:] == (hidden, False) and "gate" not in sizes:
        used.add("g_proj")
        if head_gate[0] == out[1][1]:
            sizes["gate"] = True
        else:
            sizes["head_gate"] = head_gate[0]
    own = dict(module.named_parameters(recurse=False))
    if sizes.get("gate") and "gate_bias" in own:  # a bias per head on the output gate (Beam)
        used.add("gate_bias")
        sizes["gate_bias"] = int(own["gate_bias"].numel())
    lambdas = {f"lambda_{x}" for x in ("q1", "k1", "q2", "k2")}  # differential attention's (DiffLlama)
    if lambdas <= set(own) and len({own[n].numel() for n in lambdas}) == 1:
        used |= lambdas
        sizes["diff"] = int(own["lambda_q1"].numel())
    if "sinks" in own:
        used.add("sinks")
        sizes["sinks"] = int(own["sinks"].numel())
    return sizes, _rest(module, used)


def _width(module: Any) -> int:
    weight = getattr(module, "weight", None)
    return int(weight.numel()) if weight is not None else 0


def _mla(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """Multi-head latent attention: its sizes come from the config; every projection and latent norm is its."""
    known = {"q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
             "o_proj"}
    biased = [n for n, m in children(module).items() if getattr(m, "bias", None) is not None and "norm" not in n]
    sizes: dict[str, Any] = {"biased": biased}
    kids = children(module)
    gate, rope_norm = kids.get("g_proj"), kids.get("k_rope_only_layernorm")  # Bailing-hybrid's, dots3's
    if gate is not None and linear(gate) == (getattr(module, "num_heads", -1), hidden, False):
        sizes["head_gate"], known = True, known | {"g_proj"}
    if rope_norm is not None:
        sizes["rope_norm"], known = _width(rope_norm), known | {"k_rope_only_layernorm"}
    indexer = children(module).get("indexer")
    if indexer is not None:  # DeepSeek Sparse Attention's lightning indexer (indexer.py)
        sizes["indexer"], bad = read_indexer(indexer, hidden)
        return sizes, _rest(module, known | {"indexer"}) + [f"indexer.{b}" for b in bad]
    return sizes, _rest(module, known)


def _mlp(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """The FFN width (down's input), whether gated (a gate projection, or an up projection 2F wide), biases."""
    up, down, gate = _take(module, UP), _take(module, tuple(n for n in DOWN if n != "c_fc")), _take(module, GATE)
    if (pair := _sequential(module)) is not None:
        up, down = pair
    if up and down and up[0] == down[0]:  # GPT-2's c_proj is the MLP's down projection, never its up
        up = None
    if up is None or down is None:
        return {}, _rest(module, set())
    ffn = down[1][1]
    gated = gate is not None or up[1][0] == 2 * ffn != hidden or up[0] in ("gate_up_proj", "input_linear")
    if gate is not None and gate[0] == up[0]:
        gate = None
    parts = [p for p in (up, down, gate) if p is not None]
    biases = {p[1][2] for p in parts}
    sizes = {"ffn": ffn, "gated": gated, "bias": biases == {True}, "mixed_bias": len(biases) > 1,
             "up_out": up[1][0], "in": up[1][1]}
    return sizes, _rest(module, {p[0] for p in parts})


def _mamba(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """A Mamba-2 mixer's sizes from its weights: n_h = |A_log|, D_i = out_proj's input, conv channels D_i + 2·G·N
    and kernel k from conv1d; a Mamba-1 mixer (A_log of shape (D_i, N)) or any other recurrent mixer is unclaimed."""
    names = {n for n, _ in module.named_parameters()}
    a_log = dict(module.named_parameters(recurse=False))["A_log"]
    if a_log.dim() != 1 or not {"A_log", "D", "dt_bias", "in_proj.weight", "conv1d.weight", "out_proj.weight"} <= names:
        return {}, [f"({type(module).__name__}: a recurrent mixer other than Mamba-2)"]
    kids = children(module)
    conv = kids["conv1d"].weight
    in_proj, out_proj = linear(kids["in_proj"]), linear(kids["out_proj"])
    assert in_proj is not None and out_proj is not None
    sizes = {"heads": int(a_log.shape[0]), "inner": out_proj[1], "conv_dim": int(conv.shape[0]),
             "kernel": int(conv.shape[-1]), "in_proj": in_proj[0], "in_bias": in_proj[2], "out_bias": out_proj[2],
             "conv_bias": "conv1d.bias" in names, "norm": "norm.weight" in names}
    return sizes, [f"{n} (a Mamba-2 mixer has no such weight)" for n in names - MAMBA2]


def _deltanet(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """A Gated DeltaNet mixer (Qwen3-Next's in_proj_qkvz + in_proj_ba, Qwen 3.5's in_proj_qkv / _z / _b / _a; OLMo
    hybrid's q/k/v/g/a/b_proj, o_proj and o_norm): n_v = |A_log|, the value width n_v·d_v = the output projection's
    input, conv channels 2·n_k·d_k + n_v·d_v, the input projections' widths summed, the gated norm's width d_v;
    biases and other weights unclaimed."""
    kids, own = children(module), dict(module.named_parameters(recurse=False))
    names = {n for n, _ in module.named_parameters()}
    out_name, norm_name = ("o_proj", "o_norm") if "o_proj" in kids else ("out_proj", "norm")
    inputs = {n: linear(kid) for n, kid in kids.items() if n not in (out_name, norm_name, "conv1d")}
    out, conv = linear(kids[out_name]) if out_name in kids else None, kids.get("conv1d")
    if own["A_log"].dim() != 1 or out is None or conv is None or None in inputs.values() or "dt_bias" not in own:
        return {}, [f"({type(module).__name__}: a recurrent mixer other than Gated DeltaNet)"]
    known = {"A_log", "dt_bias", "conv1d.weight", f"{norm_name}.weight", f"{out_name}.weight"} | {
        f"{n}.weight" for n in inputs}
    biased = [n for n in names if n.endswith(".bias")]
    sizes = {"heads": int(own["A_log"].shape[0]), "value": out[1], "conv_dim": int(conv.weight.shape[0]),
             "kernel": int(conv.weight.shape[-1]), "in_proj": sum(i[0] for i in inputs.values() if i),
             "norm": _width(kids[norm_name]) if norm_name in kids else 0}
    return sizes, [f"{n} (a Gated DeltaNet mixer meshplan models has no such weight)" for n in
                   sorted(names - known) + biased]


def _mamba1(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """A Mamba-1 mixer (HF MambaMixer): D_i and N from A_log, r from dt_proj's input, k from conv1d; in_proj 2·D_i
    wide and x_proj r + 2N, biases only on conv1d and dt_proj (use_bias false); anything else unclaimed."""
    kids, own = children(module), dict(module.named_parameters(recurse=False))
    names = {n for n, _ in module.named_parameters()}
    d_i, n = (int(x) for x in own["A_log"].shape)
    shapes = {k: got for k in ("in_proj", "x_proj", "dt_proj", "out_proj") if k in kids
              and (got := linear(kids[k])) is not None}
    conv = kids.get("conv1d")
    if len(shapes) < 4 or conv is None or "D" not in own:
        return {}, [f"({type(module).__name__}: a recurrent mixer other than Mamba-1)"]
    rank = shapes["dt_proj"][1]
    known = {"A_log", "D", "conv1d.weight", "conv1d.bias", "in_proj.weight", "x_proj.weight", "dt_proj.weight",
             "dt_proj.bias", "out_proj.weight"}
    norms = {f"{x}_layernorm": w for x, w in (("dt", rank), ("b", n), ("c", n))}  # Jamba's, over Δ, B and C
    if all(k in kids and _width(kids[k]) == w for k, w in norms.items()):
        known |= {f"{k}.weight" for k in norms}
    wrong = shapes["in_proj"][:2] != (2 * d_i, hidden) or shapes["x_proj"][:2] != (rank + 2 * n, d_i) or \
        shapes["out_proj"][:2] != (hidden, d_i) or "conv1d.bias" not in names or not shapes["dt_proj"][2]
    bad = sorted(names - known) + (["(a Mamba-1 mixer of other shapes or biases)"] if wrong else [])
    return {"inner": d_i, "state": n, "rank": rank, "kernel": int(conv.weight.shape[-1]),
            "norms": "dt_layernorm.weight" in known}, bad


def _moe(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """Experts (count, width, gated, biased), router (bias or score-correction bias), shared experts and gate (JetMoE's
    fused experts: moa.py)."""
    if is_fused_moe(module):
        return read_fused_moe(module, hidden)
    kids = children(module)
    experts = kids["experts"]
    sizes: dict[str, Any] = _experts(experts, hidden)
    bad = [f"experts.{b}" for b in sizes.pop("bad")]
    if bad:
        return sizes, bad
    used = {"experts"}
    num = sizes.get("experts", 0)
    for name, kid in kids.items():
        if name.startswith("shared_expert") and name != "shared_expert_gate" and kind_of(kid) == "mlp":
            shared, rest = _mlp(kid, hidden)
            sizes["shared"] = shared
            used.add(name)
            if rest:
                return sizes, [f"{name}.{r}" for r in rest]
    gate = kids.get("shared_expert_gate")
    if gate is not None and linear(gate) == (1, hidden, False):
        sizes["shared_gate"] = True
        used.add("shared_expert_gate")
    for name, kid in kids.items():
        if name in used:
            continue
        weights = dict(kid.named_parameters())
        key = "weight" if "weight" in weights else "gate.weight"  # a router module holding its linear (AFMoE)
        w = weights.get(key)
        if w is not None and tuple(w.shape) == (num, hidden):
            used.add(name)
            sizes["router_bias"] = sum(1 for n in weights if n != key) + sum(
                1 for n, _ in kid.named_buffers() if n.endswith("e_score_correction_bias"))
            if any(n != key and p.numel() != num for n, p in weights.items()):
                return sizes, [f"{name} (a router with weights beyond E×H and a bias)"]
    if "router_bias" in sizes:  # a score-correction bias held by the MoE block itself (MiniMax-M2; AFMoE's parameter)
        sizes["router_bias"] += sum(1 for n, _ in module.named_buffers(recurse=False)
                                    if n.endswith("e_score_correction_bias"))
        own = {n for n, p in module.named_parameters(recurse=False) if n == "expert_bias" and p.numel() == num}
        sizes["router_bias"] += len(own)
        used |= own
    if "router_bias" not in sizes:
        return sizes, [f"(a MoE block {type(module).__name__} without an E×H router)"] + _rest(module, used)
    return sizes, _rest(module, used)


def _experts(experts: Any, hidden: int) -> dict[str, Any]:
    """Fused expert tensors (E, ·, ·): gate_up_proj (2F and H), down_proj (F and H), their biases; or a ModuleList
    of MLPs."""
    import torch
    if isinstance(experts, torch.nn.ModuleList):
        first, rest = _mlp(experts[0], hidden)
        same = all(_mlp(e, hidden)[0] == first for e in experts)
        return {"experts": len(experts), **first, "bad": rest or ([] if same else ["experts of different widths"])}
    own = dict(experts.named_parameters())
    down = own.get("down_proj")
    up = own.get("gate_up_proj", own.get("up_proj"))
    if down is None or up is None or down.dim() != 3:
        return {"experts": 0, "bad": [f"({type(experts).__name__}: {sorted(own)})"]}
    ffn = int(down.shape[2] if down.shape[1] == hidden else down.shape[1])
    up_out = int(up.shape[1] * up.shape[2] // hidden)
    known = {"gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias", "up_proj_bias"}
    bias = {"gate_up_proj_bias" in own or "up_proj_bias" in own, "down_proj_bias" in own}
    return {"experts": int(down.shape[0]), "ffn": ffn, "gated": up_out == 2 * ffn and "gate_up_proj" in own,
            "bias": bias == {True}, "mixed_bias": len(bias) > 1,
            "bad": [f"{n} {tuple(p.shape)}" for n, p in own.items() if n not in known]}


READERS = {"attention": _attention, "mla": _mla, "mlp": _mlp, "mamba": _mamba, "deltanet": _deltanet, "mamba1": _mamba1,
           "moe": _moe} | LINEAR_READERS
