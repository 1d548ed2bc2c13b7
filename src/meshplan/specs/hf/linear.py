"""Linear-attention mixers read off a meta-device decoder layer (modules.py) and turned into ModelSpec fields
(generic.py): Kimi Delta Attention ("K": transformers' KimiLinearDeltaAttention, low-rank forget and output gates;
BailingHybridDeltaAttention, full-rank ones) and MiniMax's lightning attention ("L": MiniMaxLightningAttention). Each
reader gives the sizes and the weights that differ from the mixer ModelSpec counts (mixer_params.py): those the
reader refuses, naming them. Griffin's RG-LRU ("R": RecurrentGemmaRecurrentBlock) and LFM2's short convolution
("C": Lfm2ShortConv, LFM3's Lfm3ShortConv) likewise.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError


def linear_kind(module: Any) -> str | None:
    """"kda" (a forget_gate module beside a conv1d and q/k/v projections), "lightning" (qkv_proj, out_proj and an
    output_gate), else None."""
    kids = dict(module.named_children())
    if {"forget_gate", "conv1d", "q_proj", "b_proj"} <= set(kids):
        return "kda"
    if {"qkv_proj", "out_proj", "output_gate"} <= set(kids):
        return "lightning"
    if {"linear_x", "linear_y", "linear_out", "conv_1d", "rg_lru"} <= set(kids):
        return "rglru"
    if set(kids) == {"conv", "in_proj", "out_proj"} and type(kids["conv"]).__name__ == "Conv1d":
        return "shortconv"
    return None


def _shapes(module: Any) -> dict[str, tuple[int, ...]]:
    return {n: tuple(int(x) for x in p.shape) for n, p in module.named_parameters()}


def _differ(shapes: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]]) -> list[str]:
    bad = [f"{n} {shape}" for n, shape in shapes.items() if want.get(n) != shape]
    return bad + [f"(no {n})" for n in want if n not in shapes]


def read_kda(module: Any, hidden: int) -> tuple[dict[str, int], list[str]]:
    """Heads n (b_proj's outputs), width n·d (q_proj's), gate rank r (f_a_proj's outputs; 0: f_proj), kernel k."""
    shapes = _shapes(module)
    n, nd = shapes.get("b_proj.weight", (1,))[0], shapes.get("q_proj.weight", (0,))[0]
    r = shapes.get("forget_gate.f_a_proj.weight", (0,))[0]
    k = shapes.get("conv1d.weight", (0, 0, 0))[-1]
    a_log = shapes.pop("forget_gate.A_log", None)
    want = {f"{x}_proj.weight": (nd, hidden) for x in "qkv"} | {
        "conv1d.weight": (3 * nd, 1, k), "b_proj.weight": (n, hidden), "o_norm.weight": (nd // n,),
        "o_proj.weight": (hidden, nd), "forget_gate.dt_bias": (nd,)}
    if r:
        want |= {"forget_gate.f_a_proj.weight": (r, hidden), "forget_gate.f_b_proj.weight": (nd, r),
                 "g_a_proj.weight": (r, hidden), "g_b_proj.weight": (nd, r)}
    else:
        want |= {"forget_gate.f_proj.weight": (nd, hidden), "g_proj.weight": (nd, hidden)}
    bad = _differ(shapes, want) + ([] if a_log is not None and _numel(a_log) == n else [f"forget_gate.A_log {a_log}"])
    return {"heads": n, "width": nd, "rank": r, "kernel": k}, bad


def read_lightning(module: Any, hidden: int) -> tuple[dict[str, int], list[str]]:
    """The width A·d (out_proj's input) of a lightning-attention mixer."""
    shapes = _shapes(module)
    width = shapes.get("out_proj.weight", (0, 0))[1]
    want = {"qkv_proj.weight": (3 * width, hidden), "out_proj.weight": (hidden, width),
            "output_gate.weight": (width, hidden), "norm.weight": (width,)}
    return {"width": width}, _differ(shapes, want)


def read_rglru(module: Any, hidden: int) -> tuple[dict[str, int], list[str]]:
    """Width W (linear_x's outputs), gate blocks n (the block-diagonal gates' first axis) and conv kernel k of an
    RG-LRU block (HF RecurrentGemmaRecurrentBlock)."""
    shapes = _shapes(module)
    w, k = shapes.get("linear_x.weight", (0,))[0], shapes.get("conv_1d.weight", (0, 0, 0))[-1]
    n = shapes.get("rg_lru.input_gate_weight", (1,))[0]
    want = {f"linear_{x}.weight": (w, hidden) for x in "xy"} | {f"linear_{x}.bias": (w,) for x in "xy"} | {
        "linear_out.weight": (hidden, w), "linear_out.bias": (hidden,), "conv_1d.weight": (w, 1, k),
        "conv_1d.bias": (w,), "rg_lru.recurrent_param": (w,)}
    want |= {f"rg_lru.{g}_gate_weight": (n, w // n, w // n) for g in ("input", "recurrent")}
    want |= {f"rg_lru.{g}_gate_bias": (n, w // n) for g in ("input", "recurrent")}
    return {"width": w, "heads": n, "kernel": k}, _differ(shapes, want)


def read_shortconv(module: Any, hidden: int) -> tuple[dict[str, int], list[str]]:
    """The kernel L of a short-convolution mixer (HF Lfm2ShortConv): in_proj H → 3H (B, C, x), a depthwise conv over
    the H channels, out_proj H → H, no biases (conv_bias false; with it the biases are refused)."""
    shapes = _shapes(module)
    k = shapes.get("conv.weight", (0, 0, 0))[-1]
    want = {"in_proj.weight": (3 * hidden, hidden), "conv.weight": (hidden, 1, k), "out_proj.weight": (hidden, hidden)}
    return {"kernel": k}, _differ(shapes, want)


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for x in shape:
        total *= x
    return total


def linear_fields(cfg: Any, sizes: dict[str, Any], fields: dict[str, Any], where: str) -> dict[str, Any]:
    """Kimi Delta Attention's n, d, r and kernel (in the Gated DeltaNet fields, which it must not share with a Gated
    DeltaNet); the lightning block (``block_size``), the lightning width checked against the heads × head_dim the
    attention layers have."""
    out: dict[str, Any] = {}
    kda, lightning = sizes.get("kda"), sizes.get("lightning")
    if kda is not None:
        if sizes.get("deltanet") is not None:
            raise SpecError(f"{where}: Gated DeltaNet and Kimi Delta Attention layers side by side are not modelled")
        d = kda["width"] // kda["heads"]
        out |= {"gdn_key_heads": kda["heads"], "gdn_value_heads": kda["heads"], "gdn_key_dim": d, "gdn_value_dim": d,
                "gdn_conv": kda["kernel"], "kda_gate_rank": kda["rank"]}
    if sizes.get("rglru") is not None:
        lru = sizes["rglru"]
        out |= {"lru_width": lru["width"], "lru_heads": lru["heads"], "lru_conv": lru["kernel"]}
    if sizes.get("shortconv") is not None:
        out["short_conv"] = sizes["shortconv"]["kernel"]
    if lightning is not None:
        width = fields.get("num_heads", 0) * fields.get("head_dim", 0)
        if sizes.get("attention") is None or lightning["width"] != width:
            raise SpecError(f"{where}: the lightning attention is {lightning['width']} wide, not the attention's "
                            f"heads × head_dim ({width})")
        out["lightning_block"] = int(getattr(cfg, "block_size", 256) or 256)
    return out


LINEAR_READERS = {"kda": read_kda, "lightning": read_lightning, "rglru": read_rglru, "shortconv": read_shortconv}
