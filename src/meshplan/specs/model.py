"""ModelSpec: a decoder-only transformer, dense or mixture-of-experts, with exact parameter counts.

Symbols (used across meshplan):
    L layers, H hidden size, A attention heads, K key/value heads, d head dim, F FFN hidden size,
    V vocabulary, S sequence length, E experts, k experts per token (top-k), Fe expert FFN size.

Parameter counts follow the module structure of the Hugging Face implementations (Llama, Mistral/Mixtral,
Qwen2/Qwen3(-MoE), GPT-2, GPT-NeoX, DeepSeek-V3) so that they equal ``sum(p.numel() for p in model.parameters())``.
Sources for the layouts: HF ``modeling_llama.py`` (q/k/v/o, gate/up/down, RMSNorm weight only),
``modeling_gpt2.py`` (Conv1D with bias, LayerNorm weight+bias, learned positions, tied head),
DeepSeek-V3 technical report §2.1 (MLA: low-rank q and kv compression with decoupled RoPE keys).

Hybrid models (``layer_pattern``, Nemotron-H / Nemotron 3): each layer is one block with its own pre-norm and
residual, "M" a Mamba-2 mixer (mixer_params.py), "*" attention, "-" a dense MLP, "E" a MoE (HF
``modeling_nemotron_h.py``, ``hybrid_override_pattern``; Megatron-Core ``megatron/core/models/mamba``). A latent MoE
(``moe_latent_size``, Nemotron 3 Super) routes on H, projects the tokens H → latent (``fc1_latent_proj``), runs
the experts latent → F → latent, and projects their sum back (``fc2_latent_proj``).

The rules its fields must meet are model_checks.py's; presets, TOML files and config.json load in model_load.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from meshplan.errors import SpecError
from meshplan.specs import mixer_params
from meshplan.specs import model_extras as extras
from meshplan.specs.model_checks import BLOCK_KINDS, check_fields, check_params, check_structure


@dataclass(frozen=True, kw_only=True)
class ModelSpec(extras.ModelExtras):
    """A decoder-only transformer. Sizes are per layer unless stated (module glossary); extras: model_extras.py."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_kv_heads: int = 0  # 0 → num_heads (MHA); 1 → MQA; in between → GQA
    head_dim: int = 0  # 0 → hidden_size // num_heads
    seq_length: int = 2048
    mlp: str = "gelu"  # "gelu" / "relu2": up → act → down;  "swiglu": (act(gate) * up) → down
    norm: str = "layernorm"
    tied_embeddings: bool = False
    qkv_bias: bool = False  # bias on the q, k, v projections (GPT-2, NeoX, Qwen2)
    linear_bias: bool = False  # bias on the attention output and MLP linears (GPT-2, NeoX)
    qk_norm: bool = False  # per-head norm (of the model's kind) on q and k (Qwen3; Persimmon's LayerNorm)
    qk_norm_full: bool = False  # with qk_norm: one norm over all of q (A·d) and one over all of k (K·d) (OLMo 2)
    # Finer biases, where linear_bias (the output projection and the MLP both) is off: the output projection's
    # alone (Phi-3-small-style attention) or the MLP's alone (GPT-J's fc_in / fc_out); the LM head's (Phi-1/2)
    out_bias: bool = False
    mlp_bias: bool = False
    head_bias: bool = False
    norm_bias: bool = True  # a LayerNorm's bias (False: weight only, as MPT's and Cohere's); RMSNorm has none
    norm_weights: bool = True  # False: norms without learned weights (OLMo 1's non-parametric LayerNorm)
    # H-wide norms in an attention + MLP layer: 2 pre-norms (Llama), 1 before a parallel attention + MLP (GPT-J,
    # Phi-2, Cohere, Falcon-7B), 4 with the post-norms of Gemma 2 / 3 (HF modeling_gemma2.py Gemma2DecoderLayer)
    layer_norms: int = 2
    position_embedding: str = "rope"
    # the RoPE base (HF ``rope_theta``; Llama 3 500,000): no cost depends on it, configs/ write it; 0: not stated
    rope_theta: float = field(default=0.0, compare=False)
    yarn_rope: bool = False  # YaRN-scaled RoPE, cos / sin times its mscale (GPT-OSS): cost/attention.py unfused_rope
    dropout: bool = False  # dropout after attention / MLP (GPT-3-era Megatron); adds masks to activations
    causal: bool = True  # causal (decoder) attention; False for encoders such as ViT
    # Sliding-window attention (Mistral 7B v0.1, Gemma 2/3, GPT-OSS): in ``window_layers`` of the attention layers a
    # query sees only the last ``sliding_window`` keys, itself included (HF ``sliding_window``, ``layer_types``);
    # 0: none; window_layers = 0 with a window: every attention layer. Which layers they are is not modelled (a
    # stage is priced as the average layer; a contiguous run, Qwen2's max_window_layers, would load stages unevenly).
    sliding_window: int = 0
    window_layers: int = 0
    # rows of the learned position table; with RoPE the longest context the checkpoint serves (HF config.json's
    # max_position_embeddings, after long-context training or YaRN), which serve's requests may fill; 0: seq_length
    max_position_embeddings: int = 0
    # Mixture of experts. num_experts = 0 is a dense model.
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    shared_expert_ffn_size: int = 0  # total FFN width of the shared experts (0: none)
    first_k_dense_layers: int = 0  # the first k layers use a dense MLP of ffn_hidden_size
    moe_layer_freq: int = 1  # after those, every n-th layer is MoE
    router_bias: bool = False  # per-expert score-correction bias (DeepSeek-V3), router linear bias (GPT-OSS)
    shared_expert_gate: bool = False  # sigmoid(Linear(H, 1)) on the shared expert (Qwen2-MoE): H per layer
    attention_sinks: bool = False  # one learned sink logit per head (GPT-OSS ``sinks``): A per layer
    diff_attention: bool = False  # two softmax maps a head, their difference (DiffLlama; cost/attention.py)
    # a sigmoid gate on the attention output, elementwise per head channel, of width A·d from the query projection
    # (Qwen3-Next / Qwen 3.5: HF Qwen3NextAttention, q_proj H → 2·A·d chunked into query and gate, attn_output *
    # sigmoid(gate) before o_proj; Qiu et al. 2025, "Gated Attention for LLMs", G1): H·A·d more (+ A·d with qkv_bias)
    attn_output_gate: bool = False
    gate_bias: bool = False  # a bias per head added to that gate (Beam's gate_bias): A weights
    # the GLU clamps its gate from above, its linear input both ways (GPT-OSS ``swiglu_limit`` = 7); 0: no clamp
    glu_clamp: float = 0.0
    embedding_norm: bool = False  # a norm right after the token embedding (BLOOM word_embeddings_layernorm)
    # Multi-head latent attention (DeepSeek-V2/V3). kv_lora_rank = 0 means standard attention.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek Sparse Attention (MLA; cost/dsa.py): an indexer of index_heads × index_head_dim keeps index_topk keys
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    attn_head_gate: bool = False  # a gate per head on the output, g_proj H → A (Bailing-hybrid, Laguna): H·A weights
    rope_key_norm: bool = False  # an RMSNorm over MLA's decoupled RoPE key (dots3's k_rope_only_layernorm): d_R
    # Hybrid: a letter per block (model_checks.BLOCK_KINDS); "": every layer attention + MLP (MoE: first_k_dense_layers)
    layer_pattern: str = ""
    mamba_heads: int = 0  # n_h
    mamba_head_dim: int = 0  # P
    mamba_state: int = 0  # N, the SSM state size
    mamba_groups: int = 1  # G, groups of heads sharing B and C
    mamba_conv: int = 4  # k, the causal conv1d kernel
    mamba_chunk: int = 128  # Q, the SSD chunk length (mamba_chunk_scan_combined)
    mamba_norm: bool = True  # the gated RMSNorm's weight (False: Falcon-H1's mamba_rms_norm off, y·silu(z) alone)
    moe_latent_size: int = 0  # latent MoE width (0: experts on the hidden size)
    # Gated DeltaNet ("G"; Yang et al. 2024; HF Qwen3NextGatedDeltaNet): n_k q/k heads of d_k, n_v value heads of d_v
    gdn_key_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_heads: int = 0
    gdn_value_dim: int = 0
    gdn_conv: int = 4
    gdn_chunk: int = 64
    # Mamba-1 ("S"; Gu & Dao 2023; HF MambaMixer): D_i channels, Δ of rank r (state N, kernel k: mamba_state, _conv),
    # with RMSNorms over Δ, B and C (Jamba's dt/b/c_layernorm: r + 2N)
    ssm_inner: int = 0
    ssm_dt_rank: int = 0
    ssm_norms: bool = False
    # (mixer_params.py) "K" (Kimi Delta Attention): n = gdn_value_heads of d = gdn_value_dim, gates H → r → n·d (r =
    # kda_gate_rank; 0: H → n·d); "L" (lightning attention): num_heads of head_dim, blocks of lightning_block; "R"
    # (Griffin's RG-LRU, RecurrentGemma): width lru_width, gates of lru_heads blocks, conv kernel lru_conv; "C" (LFM2's
    # short convolution, cost/shortconv.py): in_proj H → 3H, a depthwise causal conv1d of kernel short_conv, out_proj
    kda_gate_rank: int = 0
    lightning_block: int = 256
    lru_width: int = 0
    lru_heads: int = 0
    lru_conv: int = 4
    short_conv: int = 0
    # "W" (windowed attention) blocks beside full "*" ones, of their own head width, KV heads and sinks (0 / False:
    # the model's; Gemma 4 unified, dots3: mixer_params.window_attention_spec); norms per hybrid block (2: post-norms)
    window_head_dim: int = 0
    window_kv_heads: int = 0
    window_sinks: bool = False
    block_norms: int = 1
    # Multi-token prediction (DeepSeek-V3 §2.2; Megatron-Core multi_token_prediction.py): ``mtp_layers`` extra depths
    # after the last layer on the last stage: the next tokens' embedding and the previous depth's hidden state, each
    # normed (enorm, hnorm), concatenated and projected 2H → H (eh_proj), one layer (a hybrid: ``mtp_pattern``'s
    # blocks), a final norm, the shared LM head and loss; ``mtp_shared``: one layer at every depth (Megatron-Core
    # mtp_use_repeated_layer). Not in ``params()``, which counts what Hugging Face builds (``mtp_params``).
    mtp_layers: int = 0
    mtp_pattern: str = ""
    mtp_shared: bool = False
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        check_fields(self)  # types, signs, hybrid pattern, MTP, sliding window, ranges (model_checks.py)
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads and not self.is_mla:
                raise SpecError(f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}; "
                                "give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        check_structure(self)  # KV heads, choices, MoE, MLA, learned positions (model_checks.py)
        if self.num_experts and self.moe_ffn_hidden_size == 0:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        if self.position_embedding == "learned" and self.max_position_embeddings == 0:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        check_params(self)

    # ---- structure ------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:  # multi-head latent attention
        return self.kv_lora_rank > 0

    @property
    def gated(self) -> bool:  # a GLU MLP
        return self.mlp == "swiglu"

    @property
    def is_hybrid(self) -> bool:
        """One block per layer (``layer_pattern``), not attention + MLP."""
        return bool(self.layer_pattern)

    @cached_property
    def block_counts(self) -> dict[str, int]:
        """Layers of each kind: {"dense": L - L_moe, "moe": L_moe} (attention + MLP / MoE layers), or for a hybrid
        the blocks of each kind in ``layer_pattern`` ("mamba", "attention", "mlp", "moe"), kinds present only."""
        if not self.is_hybrid:
            moe = self.num_moe_layers
            return {k: n for k, n in (("dense", self.num_layers - moe), ("moe", moe)) if n}
        counts = {kind: self.layer_pattern.count(letter) for letter, kind in BLOCK_KINDS.items()}
        return {k: n for k, n in counts.items() if n}

    @property
    def num_attention_layers(self) -> int:
        """Layers with an attention block (all of them unless hybrid; "P" blocks run one beside their Mamba-2)."""
        return self.layer_pattern.count("*") + self.layer_pattern.count("P") if self.is_hybrid else self.num_layers

    @property
    def window_share(self) -> float:
        """Share of the attention layers whose keys a sliding window shorter than the sequence limits (0 without
        one; window_layers = 0 with a window: all of them)."""
        if not 0 < self.sliding_window < self.seq_length or "W" in self.layer_pattern:  # "*" full beside "W"
            return 0.0
        return self.window_layers / self.num_attention_layers if self.window_layers else 1.0

    def window_keys(self) -> float:
        """Keys a query of a windowed layer attends to, on average over the sequence: min(i + 1, w) summed over
        the s positions i, divided by s, = w − w·(w − 1)/(2s) for w = min(sliding_window, s) (s(s + 1)/(2s) =
        (s + 1)/2 at w = s: a causal layer's)."""
        w = min(self.sliding_window, self.seq_length)
        return w - w * (w - 1) / (2 * self.seq_length)

    @property
    def mamba_inner(self) -> int:  # D_i = n_h·P, the width of x, z and the gated norm
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:  # channels of the causal conv1d: x, B and C (D_i + 2·G·N)
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state

    @property
    def moe_width(self) -> int:  # the width of the tokens the experts see (and the all-to-all carries)
        return self.moe_latent_size or self.hidden_size

    def is_moe_layer(self, i: int) -> bool:
        """Layer i (0-based) has an MoE MLP: after the first k dense layers, every moe_layer_freq-th layer
        (a hybrid: an "E" block)."""
        if self.is_hybrid:
            return self.layer_pattern[i] == "E"
        after = i - self.first_k_dense_layers
        return self.is_moe and after >= 0 and after % self.moe_layer_freq == 0

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def q_dim(self) -> int:  # the concatenated queries' width: A·d (MLA: A·(d_nope + d_rope))
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def gate_dim(self) -> int:  # the attention output gate's width (``attn_output_gate``): A·d, else 0
        return self.q_dim if self.attn_output_gate else 0

    @property
    def kv_dim(self) -> int:  # the keys' width, K·d (the values': v_dim)
        return self.num_kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:  # the values' width: K·d, or K·v_head_dim in a hybrid's attention (MiMo-V2-Flash)
        return self.num_kv_heads * (self.v_head_dim or self.head_dim)

    @property
    def attn_out_dim(self) -> int:  # the output projection's input: A·d (MLA, v_head_dim set: A·d_v)
        return self.num_heads * (self.v_head_dim or self.head_dim)

    # ---- parameters -----------------------------------------------------------------------------------
    def norm_params(self, width: int) -> int:
        """LayerNorm has a weight and a bias; RMSNorm only a weight."""
        return width * (1 + self.norm_bias if self.norm == "layernorm" else 1) if self.norm_weights else 0

    def attention_params(self, active: bool = False) -> int:
        """Parameters of one attention block (projections, biases, q/k norms), without the pre-norm."""
        h = self.hidden_size
        if self.is_mla:
            a, rope, nope, dv = self.num_heads, self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * (nope + rope)
            else:
                q = h * a * (nope + rope)
            kv = h * (self.kv_lora_rank + rope) + self.kv_lora_rank + self.kv_lora_rank * a * (nope + dv)
            extra = self.indexer_params() + self.attn_head_gate * h * a + self.rope_key_norm * rope
            return q + kv + a * dv * h + extra
        q, kv = self.q_dim, self.kv_dim
        total = h * (q + self.gate_dim) + h * (kv + self.v_dim) + self.attn_out_dim * h
        if self.qkv_bias:
            total += q + self.gate_dim + kv + self.v_dim
        if self.linear_bias or self.out_bias:
            total += h
        if self.qk_norm:
            widths = (q, kv) if self.qk_norm_full else (self.head_dim, self.head_dim)
            total += sum(self.norm_params(w) for w in widths)
        if self.attention_sinks or self.attn_head_gate or self.gate_bias:
            total += self.num_heads * (self.attention_sinks + self.gate_bias + self.attn_head_gate * h)
        return total + 4 * self.head_dim * self.diff_attention + extras.attention_extra_params(self, active)  # λ ×4

    def indexer_params(self) -> int:
        return mixer_params.indexer_count(self)  # DSA's lightning indexer; 0 without one

    def mlp_params(self, ffn: int) -> int:
        """A dense MLP of width ffn: 2·H·F (GeLU) or 3·H·F (SwiGLU), plus biases."""
        h = self.hidden_size
        mats = 3 if self.gated else 2
        total = mats * h * ffn
        if self.linear_bias or self.mlp_bias:
            total += (mats - 1) * ffn + h
        return total + extras.mlp_extra_params(self, ffn)

    def expert_params(self) -> int:
        """One routed expert: an MLP of width F_e on the hidden size, or on the latent size (latent MoE)."""
        if not self.moe_latent_size:
            return self.mlp_params(self.moe_ffn_hidden_size)
        return (3 if self.gated else 2) * self.moe_latent_size * self.moe_ffn_hidden_size

    def moe_params(self, active: bool = False) -> int:
        """One MoE MLP: router H·E (+E bias), E (or top-k when active) experts, shared experts, the latent
        projections H·latent each way (latent MoE)."""
        experts = self.moe_topk if active else self.num_experts
        total = self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)
        total += experts * self.expert_params() + 2 * self.hidden_size * self.moe_latent_size
        shared = self.mlp_params(self.shared_expert_ffn_size) if self.shared_expert_ffn_size else 0
        return total + shared + (self.hidden_size if self.shared_expert_gate else 0) + extras.moe_extra_params(self)

    def mamba_params(self) -> int:
        return mixer_params.mamba2_count(self)  # one Mamba-2 mixer, as the mixers below: mixer_params.py

    @property
    def gdn_dims(self) -> tuple[int, int]:  # (n_k·d_k, n_v·d_v): the widths of q (= k) and of v (= z)
        return self.gdn_key_heads * self.gdn_key_dim, self.gdn_value_heads * self.gdn_value_dim

    def mamba1_params(self) -> int:
        return mixer_params.mamba1_count(self)

    @extras.per_spec
    def block_params(self, kind: str, active: bool = False) -> int:
        """One layer of ``block_counts``'s kind, its norms included."""
        norms = self.layer_norms * self.norm_params(self.hidden_size)
        norm = self.norm_params(self.hidden_size) * self.block_norms  # a hybrid block's
        mlp = self.mlp_params(self.ffn_hidden_size)
        att = self.attention_params(active)
        return {"dense": lambda: att + mlp + norms,
                "moe": lambda: (norm if self.is_hybrid else att + norms) + self.moe_params(active),
                "mamba": lambda: self.mamba_params() + norm,
                "deltanet": lambda: mixer_params.deltanet_count(self) + norm,
                "mamba1": lambda: self.mamba1_params() + norm, "attention": lambda: att + norm,
                "kda": lambda: mixer_params.kda_count(self) + norm,
                "lightning": lambda: mixer_params.lightning_count(self) + norm, "mlp": lambda: mlp + norm,
                "window": lambda: mixer_params.window_attention_spec(self).attention_params() + norm,
                "parallel": lambda: att + self.mamba_params() + norm,
                "rglru": lambda: mixer_params.rglru_count(self) + norm,
                "shortconv": lambda: mixer_params.shortconv_count(self) + norm}[kind]()

    def layer_params(self, i: int, active: bool = False) -> int:
        kind = BLOCK_KINDS[self.layer_pattern[i]] if self.is_hybrid else "moe" if self.is_moe_layer(i) else "dense"
        return self.block_params(kind, active) + extras.edge_layer_params(self, i)

    def embedding_params(self) -> int:
        """Token embedding V·H plus learned positions (if any) and the embedding norm (if any)."""
        positions = self.max_position_embeddings if self.position_embedding == "learned" else 0
        norm = self.norm_params(self.hidden_size) if self.embedding_norm else 0
        return (self.vocab_size + positions) * self.hidden_size + norm + extras.ple_embedding_params(self)

    def head_params(self) -> int:
        """Final norm (unless ``final_norm`` is off) plus the LM head (V·H unless tied: model_extras.lm_head_params)."""
        return (self.norm_params(self.hidden_size) if self.final_norm else 0) + extras.lm_head_params(self)

    @property
    def mtp_kinds(self) -> tuple[str, ...]:
        """The block kinds of one MTP layer: a hybrid's ``mtp_pattern``, else one layer of the last layer's kind."""
        if not self.mtp_layers:
            return ()
        if self.is_hybrid:
            return tuple(BLOCK_KINDS[c] for c in self.mtp_pattern)
        return ("moe" if self.is_moe_layer(self.num_layers - 1) else "dense",)

    def mtp_layer_params(self, active: bool = False) -> int:
        """One MTP layer: enorm, hnorm and the final norm, eh_proj 2H·H, its blocks (``mtp_kinds``)."""
        h = self.hidden_size
        return 3 * self.norm_params(h) + 2 * h * h + sum(self.block_params(k, active) for k in self.mtp_kinds)

    def mtp_params(self) -> int:
        """Parameters of the MTP layers (one set when ``mtp_shared``); the embedding and head are shared."""
        return (1 if self.mtp_shared else self.mtp_layers) * self.mtp_layer_params() if self.mtp_layers else 0

    def params(self, active: bool = False) -> int:
        """Total parameters (``active=True``: top-k experts only), summed once per spec (model_extras.param_counts)."""
        return self._param_counts[active]

    _param_counts = cached_property(extras.param_counts)

    def with_seq_length(self, seq_length: int) -> ModelSpec:
        """The same model at another sequence length; a learned position table grows to cover it."""
        if self.position_embedding == "learned" and seq_length > self.max_position_embeddings:
            return replace(self, seq_length=seq_length, max_position_embeddings=seq_length)
        return replace(self, seq_length=seq_length)

