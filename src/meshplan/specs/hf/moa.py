"""JetMoE's two routed blocks, as the generic reader (modules.py) reads them (transformers 5.24,
models/jetmoe/modeling_jetmoe.py):

- the mixture of attention heads (JetMoeAttention: ``experts`` a JetMoeMoA of E_a experts, each an ``input_linear``
  query projection H → K·d and an ``output_linear`` K·d → H, stored (E_a, out, in), a ``router.layer`` H → E_a and a
  ``bias`` H; one ``kv_proj`` H → 2·K·d): read as attention of A = k·K query heads (k = ``top_k``) over K key/value
  heads, q and o A·d wide, with ``experts`` = E_a for ModelSpec.attention_experts;
- the MoE MLP (JetMoeMoE: ``input_linear`` (E, 2F, H) gate and up, ``output_linear`` (E, H, F), ``router.layer``
  (E, H), ``bias`` H on the output): read as a MoE block with ``out_bias`` for ModelSpec.moe_out_bias.
"""

from __future__ import annotations

from typing import Any

_EXPERTS = ("input_linear", "output_linear", "router")


def _kids(module: Any) -> dict[str, Any]:
    return dict(module.named_children())


def is_fused_moe(module: Any) -> bool:
    """A routed block whose experts are two 3-D weights and a router (JetMoeMoA, JetMoeMoE)."""
    kids = _kids(module)
    if not all(n in kids for n in _EXPERTS):
        return False
    weights = [getattr(kids[n], "weight", None) for n in _EXPERTS[:2]]
    return all(w is not None and w.dim() == 3 for w in weights) and hasattr(kids["router"], "layer")


def is_moa(module: Any) -> bool:
    """A mixture of attention heads: attention experts beside one key/value projection."""
    kids = _kids(module)
    return "kv_proj" in kids and "experts" in kids and is_fused_moe(kids["experts"])


def _rest(module: Any, known: set[str]) -> list[str]:
    return [f"{n} {tuple(p.shape)}" for n, p in module.named_parameters() if n not in known]


def read_moa(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """Attention sizes (modules._attention's) of a mixture of attention heads, and its unclaimed weights."""
    kids = _kids(module)
    experts, kv = kids["experts"], kids["kv_proj"].weight
    q = experts.input_linear.weight  # (E_a, K·d, H)
    o = experts.output_linear.weight  # (E_a, H, K·d)
    k = int(getattr(experts, "top_k", 0) or 0)
    width = int(q.shape[1])
    bad = [] if (tuple(o.shape) == (q.shape[0], hidden, width) and q.shape[2] == hidden and k > 0 and tuple(
        kv.shape) == (2 * width, hidden) and tuple(experts.router.layer.weight.shape) == (q.shape[0], hidden)) else [
        f"({type(module).__name__}: attention experts of other shapes)"]
    known = {"experts.input_linear.weight", "experts.output_linear.weight", "experts.router.layer.weight",
             "experts.bias", "kv_proj.weight"}
    sizes = {"q": k * width, "k": width, "v": width, "q_bias": False, "k_bias": False, "v_bias": False,
             "o_in": k * width, "o_bias": False, "experts": int(q.shape[0])}
    if getattr(experts, "bias", None) is None or getattr(kids["kv_proj"], "bias", None) is not None:
        bad.append(f"({type(module).__name__}: attention experts without their output bias, or a biased kv_proj)")
    return sizes, bad + _rest(module, known)


def read_fused_moe(module: Any, hidden: int) -> tuple[dict[str, Any], list[str]]:
    """MoE sizes (modules._moe's) of JetMoeMoE, and its unclaimed weights."""
    up, down = module.input_linear.weight, module.output_linear.weight  # (E, 2F or F, H), (E, H, F)
    experts, ffn = int(up.shape[0]), int(down.shape[2])
    shapes_ok = up.shape[2] == hidden and tuple(down.shape[:2]) == (experts, hidden) and tuple(
        module.router.layer.weight.shape) == (experts, hidden) and int(up.shape[1]) in (ffn, 2 * ffn)
    sizes = {"experts": experts, "ffn": ffn, "gated": int(up.shape[1]) == 2 * ffn, "bias": False,
             "mixed_bias": False, "router_bias": 0, "out_bias": getattr(module, "bias", None) is not None}
    known = {"input_linear.weight", "output_linear.weight", "router.layer.weight", "bias"}
    bad = [] if shapes_ok else [f"({type(module).__name__}: experts of other shapes)"]
    return sizes, bad + _rest(module, known)
