"""ModelSpec fields from the block sizes modules.py reads off a meta-device model (attention, MLA, MLP, MoE,
Mamba-2), with what the weight shapes do not say taken from the transformers config: the head count
(``num_attention_heads``), the experts per token, MLA's ranks, Mamba-2's groups. A combination the spec cannot
express raises SpecError naming it. See generic.py for the whole reader.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError
from meshplan.specs.hf.indexer import indexer_fields

TOPK = ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k", "experts_per_token",
        "num_experts_per_token", "topk")
GROUPS = ("n_groups", "mamba_n_groups", "ngroups", "num_groups")
STATE_KEYS = ("ssm_state_size", "state_size", "mamba_d_state", "d_state")
RELU2 = ("relu2", "relu_squared", "squared_relu")


def _get(cfg: Any, names: tuple[str, ...]) -> Any:
    return next((v for n in names if (v := getattr(cfg, n, None)) is not None), None)


def _exact(value: float, what: str, where: str) -> int:
    if value != int(value) or value <= 0:
        raise SpecError(f"{where}: {what} = {value} is not a whole positive number")
    return int(value)


def attention_fields(cfg: Any, sizes: dict[str, Any], hidden: int, where: str) -> dict[str, Any]:
    """Heads, KV heads, head_dim, q/k/v and output biases, q/k norms and sinks, or MLA's sizes."""
    if sizes.get("mla") is not None:
        return _mla(cfg, sizes["mla"], where)
    att = sizes.get("attention")
    if att is None:  # no attention layer (Mamba): heads only so that the spec is whole
        return {"num_heads": 1, "num_kv_heads": 1}
    heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
    if heads <= 0:
        raise SpecError(f"{where}: the config has no num_attention_heads")
    if "qkv" in att:
        head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
        kv = _exact((att["qkv"] / head_dim - heads) / 2, "the fused qkv projection's KV heads", where)
        biases = {att["qkv_bias"]}
        gate = False
    else:
        if not {"q", "k", "v"} <= set(att):
            raise SpecError(f"{where}: the attention has no separate q, k and v projections meshplan recognises")
        # q_proj twice the output projection's input: queries and an output gate (Qwen3-Next's q_proj H → 2·A·d);
        # or a gate_proj of its own (AFMoE), without a bias
        fused_gate = att["q"] == 2 * att.get("o_in", 0)
        gate = fused_gate or att.get("gate", False)
        if att.get("gate") and (fused_gate or att["q_bias"]):
            raise SpecError(f"{where}: an output gate_proj beside a gated or biased q_proj is not modelled")
        head_dim = _exact(att["q"] / (2 if fused_gate else 1) / heads, f"q_proj's width {att['q']} / {heads} heads",
                          where)
        kv = _exact(att["k"] / head_dim, f"k_proj's width {att['k']} / head_dim {head_dim}", where)
        v_head = att["v"] // kv  # values of their own width (MiMo-V2-Flash: 128 beside 192): v_head_dim
        if v_head * kv != att["v"] or (v_head != head_dim and gate):
            raise SpecError(f"{where}: v_proj ({att['v']}) and k_proj ({att['k']}) differ in width")
        biases = {att["q_bias"], att["k_bias"], att["v_bias"]}
    if len(biases) > 1:
        raise SpecError(f"{where}: some of q, k and v have a bias and some not")
    v_head = head_dim if "qkv" in att else v_head
    if att.get("o_in") != heads * v_head:
        raise SpecError(f"{where}: the output projection takes {att.get('o_in')}, not heads × head_dim = "
                        f"{heads * v_head}")
    fields: dict[str, Any] = {"num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim,
                              "qkv_bias": biases.pop(), "out_bias": att["o_bias"], "attn_output_gate": gate}
    if v_head != head_dim:
        fields["v_head_dim"] = v_head
    fields.update(_per_head(att, heads, head_dim, where))
    if "q_norm" in att:
        per_head = att["q_norm"] == att["k_norm"] in (head_dim, 0)  # 0: weightless norms (nanochat)
        whole = (att["q_norm"], att["k_norm"]) == (heads * head_dim, kv * head_dim)
        if not (per_head or whole):
            raise SpecError(f"{where}: q/k norms of widths {att['q_norm']} / {att['k_norm']} are neither per head "
                            f"({head_dim}) nor whole")
        fields.update(qk_norm=True, qk_norm_full=whole and not per_head)
    if att.get("experts"):  # a mixture of attention heads (moa.py)
        fields["attention_experts"] = att["experts"]
    if att.get("sinks"):
        if att["sinks"] != heads:
            raise SpecError(f"{where}: {att['sinks']} attention sinks for {heads} heads")
        fields["attention_sinks"] = True
    return fields


def _per_head(att: dict[str, Any], heads: int, head_dim: int, where: str) -> dict[str, Any]:
    """Differential attention's λ vectors (head_dim each), a per-head output gate (H → A), a bias per head on the
    elementwise output gate."""
    checks = (("diff", head_dim, "differential attention's λ vectors"), ("head_gate", heads, "a per-head output gate"),
              ("gate_bias", heads, "an output-gate bias"))
    for key, want, what in checks:
        if att.get(key) not in (None, want):
            raise SpecError(f"{where}: {what} of {att[key]}, not {want} (heads {heads}, head_dim {head_dim})")
    return {"diff_attention": "diff" in att, "attn_head_gate": "head_gate" in att, "gate_bias": "gate_bias" in att}


def _mla(cfg: Any, mla: dict[str, Any], where: str) -> dict[str, Any]:
    """Multi-head latent attention (DeepSeek-V2/V3 §2.1), its ranks and head widths from the config."""
    if mla["biased"]:
        raise SpecError(f"{where}: MLA projections with biases ({', '.join(mla['biased'])}) are not modelled")
    heads = int(cfg.num_attention_heads)
    nope, rope, q_rank = int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(getattr(cfg, "q_lora_rank", 0) or 0)
    return {"num_heads": heads, "num_kv_heads": heads, "head_dim": nope + rope, "q_lora_rank": q_rank,
            "kv_lora_rank": int(cfg.kv_lora_rank), "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
            "v_head_dim": int(cfg.v_head_dim), "attn_head_gate": bool(mla.get("head_gate")),
            "rope_key_norm": _rope_norm(mla, rope, where)} | indexer_fields(cfg, mla.get("indexer"), q_rank, where)


def _rope_norm(mla: dict[str, Any], rope: int, where: str) -> bool:
    """An RMSNorm over the decoupled RoPE key (dots3's k_rope_only_layernorm), d_R wide."""
    if mla.get("rope_norm") not in (None, rope):
        raise SpecError(f"{where}: a RoPE-key norm of width {mla['rope_norm']}, not qk_rope_head_dim = {rope}")
    return "rope_norm" in mla


def ffn_fields(cfg: Any, sizes: dict[str, Any], hidden: int, where: str) -> dict[str, Any]:
    """The dense MLP's width, its kind (gated → "swiglu"; a squared ReLU → "relu2"; else "gelu") and biases;
    the routed and shared experts must be MLPs of the same kind."""
    mlps = [s for s in (sizes.get("mlp"), sizes.get("moe"), (sizes.get("moe") or {}).get("shared")) if s]
    if not mlps:
        return {"ffn_hidden_size": hidden, "mlp": "gelu"}
    kinds = {(s["gated"], s["bias"]) for s in mlps}
    if len(kinds) > 1 or any(s.get("mixed_bias") for s in mlps):
        raise SpecError(f"{where}: the MLPs and experts differ in gating or biases (meshplan has one MLP kind)")
    gated, bias = kinds.pop()
    act = str(getattr(cfg, "hidden_act", "") or getattr(cfg, "activation_function", "") or "")
    kind = "swiglu" if gated else ("relu2" if act in RELU2 else "gelu")
    ffn = (sizes.get("mlp") or {}).get("ffn") or (sizes.get("moe") or {}).get("ffn")
    return {"ffn_hidden_size": ffn, "mlp": kind, "mlp_bias": bias}


def moe_fields(cfg: Any, sizes: dict[str, Any], where: str) -> dict[str, Any]:
    """Experts, their width and top-k, the router's bias, the shared experts and their gate."""
    fields = ffn_fields(cfg, sizes, int(getattr(cfg, "hidden_size", 0) or 0), where)
    moe = sizes.get("moe")
    if moe is None:
        return fields
    topk = _get(cfg, TOPK)
    if not isinstance(topk, int) or topk <= 0:
        raise SpecError(f"{where}: the config says no number of experts per token ({' / '.join(TOPK[:3])})")
    if moe["router_bias"] > 1:
        raise SpecError(f"{where}: the router has both a bias and a score-correction bias (meshplan counts one)")
    shared = moe.get("shared")
    fields.update(num_experts=moe["experts"], moe_topk=topk, moe_ffn_hidden_size=moe["ffn"],
                  router_bias=bool(moe["router_bias"]), shared_expert_ffn_size=shared["ffn"] if shared else 0,
                  shared_expert_gate=bool(moe.get("shared_gate")), moe_out_bias=bool(moe.get("out_bias")))
    return fields


def mamba_fields(cfg: Any, mamba: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """A Mamba-2 mixer: heads, head width P = D_i / n_h, groups G (config), state N = (conv channels − D_i) / 2G,
    kernel; its in_proj must be 2·D_i + 2·G·N + n_h wide, without biases, with a conv bias and the gated norm
    (ModelSpec.mamba_params)."""
    if mamba is None:
        return {}
    heads, inner = mamba["heads"], mamba["inner"]
    groups = int(_get(cfg, GROUPS) or 1)
    state = _exact((mamba["conv_dim"] - inner) / (2 * groups), "the Mamba state size", where)
    given = _get(cfg, STATE_KEYS)
    if given is not None and given != state:
        raise SpecError(f"{where}: the Mamba mixer's conv1d implies state {state}, the config says {given}")
    if mamba["in_proj"] != 2 * inner + 2 * groups * state + heads:
        raise SpecError(f"{where}: the Mamba mixer's in_proj is {mamba['in_proj']} wide, not 2·D_i + 2·G·N + n_h "
                        f"= {2 * inner + 2 * groups * state + heads} (a Mamba-2 mixer meshplan does not model)")
    if mamba["in_bias"] or mamba["out_bias"] or not mamba["conv_bias"]:
        raise SpecError(f"{where}: the Mamba-2 mixer's biases differ from the one meshplan models (no in/out "
                        "projection bias, a conv1d bias)")
    chunk = int(getattr(cfg, "chunk_size", None) or getattr(cfg, "mamba_chunk_size", None) or 128)
    return {"mamba_heads": heads, "mamba_head_dim": _exact(inner / heads, "the Mamba head width", where),
            "mamba_state": state, "mamba_groups": groups, "mamba_conv": mamba["kernel"], "mamba_chunk": chunk,
            "mamba_norm": mamba["norm"]}  # the gated norm's weight (Falcon-H1's mamba_rms_norm may drop it)


def deltanet_fields(cfg: Any, gdn: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """A Gated DeltaNet mixer: n_v = |A_log|, d_v = out_proj's input / n_v (the gated norm's width), n_k and d_k from
    the config (``linear_num_key_heads``, ``linear_key_head_dim``), checked against the conv channels
    2·n_k·d_k + n_v·d_v and the in_proj widths 2·n_k·d_k + 2·n_v·d_v + 2·n_v (mixer_params.deltanet_count)."""
    if gdn is None:
        return {}
    heads, value = gdn["heads"], gdn["value"]
    dv = _exact(value / heads, "the Gated DeltaNet value head width", where)
    kh, dk = _get(cfg, ("linear_num_key_heads",)), _get(cfg, ("linear_key_head_dim",))
    if not isinstance(kh, int) or not isinstance(dk, int):
        raise SpecError(f"{where}: the config has no linear_num_key_heads / linear_key_head_dim")
    key = kh * dk
    if gdn["conv_dim"] != 2 * key + value or gdn["in_proj"] != 2 * key + 2 * value + 2 * heads or gdn["norm"] != dv:
        raise SpecError(f"{where}: the Gated DeltaNet mixer's conv1d ({gdn['conv_dim']}), in_proj ({gdn['in_proj']}) "
                        f"or gated norm ({gdn['norm']}) differ from 2·n_k·d_k + n_v·d_v, 2·n_k·d_k + 2·n_v·d_v + 2·n_v "
                        "and d_v (a Gated DeltaNet meshplan does not model)")
    return {"gdn_key_heads": kh, "gdn_key_dim": dk, "gdn_value_heads": heads, "gdn_value_dim": dv,
            "gdn_conv": gdn["kernel"]}
