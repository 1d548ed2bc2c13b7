"""The regular expressions that read a published record's fields, in one place: numbers written as text, the names
sources give the measured quantities, model names, GPU and network text, the precision, optimizer-sharding and
recompute wording, the framework text that names kernels, the FLOP accounting text, the models and stacks a recipe
setting applies to, and the release in a group name.

Each pattern is used where the field is read (records.py, record_fields.py, the map_*.py modules, flops.py,
recipes.py). The tables of knowledge keyed by a pattern (model families in record_fields.CONVENTIONS, framework
defaults in sources.SOURCES, release recipes in recipes.py and layouts.py) keep it in their rows, beside the sources
they cite. Plain ``re`` objects and pattern tables: nothing here reads a record."""

from __future__ import annotations

import re

# ---- numbers written as text ----------------------------------------------------------------------------------
DIGITS = re.compile(r"\d+")  # the first run of digits of a size written as text ("8 GPUs")
# a comma inside a number only groups thousands ("8,192", "1,664.5"); one followed by a digit otherwise ("12,5",
# "1.234,5") is a decimal comma or a list, which this does not guess at; one before a remark ends the number
LEADING_NUMBER = re.compile(
    r"\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?)(?=\s|\(|%|[,;](?!\d)|$)")
# words a source writes for a value it does not state (the recompute reading strips them too)
UNSTATED_WORDS = r"not stated|unstated|unknown|n/a"
# text that states nothing: empty, or one of those words (or "na"), alone or before a remark in parentheses
UNSTATED_TEXT = re.compile(rf"^\s*(?:{UNSTATED_WORDS}|na)?\s*(?:\(|$)", re.IGNORECASE)

# ---- the names of measured quantities (records.measured_name) ----------------------------------------------------
# A statistic of repeated measurements of one quantity is that quantity; where a record gives several, they are read
# in this order. A bound or a spread (``_up_to``, ``_max``, ``_min``, ``_p90``, ``_std``) is not a measurement of it
# and is not read.
STATISTICS = ("median", "p50", "mean", "average", "avg", "steady_state", "steady")
_STATISTIC = "|".join(STATISTICS)
QUALIFIED = re.compile(rf"(?:({_STATISTIC})_)?(.+?)(?:_({_STATISTIC}))?")
NAME_SEPARATORS = re.compile(r"[^a-z0-9%]+")  # a field name as lower case with underscores
# other spellings of the same name, on the lower-case name with underscores: "throughput_tokens_per_sec_per_device"
# is tokens_per_s_per_gpu, "mfu_percent" mfu_pct
_SPELLINGS = (
    (r"^(?:throughput|measured)_", ""), (r"_per_sec(?:ond)?s?(?=_|$)", "_per_s"), (r"_(?:secs?|seconds?)$", "_s"),
    (r"_(?:msecs?|milliseconds?)$", "_ms"), (r"_per_(?:device|accelerator|chip)(?=_|$)", "_per_gpu"),
    (r"_?(?:percent(?:age)?|%)$", "_pct"),
)
SPELLINGS = tuple((re.compile(pattern), replacement) for pattern, replacement in _SPELLINGS)
# a time written with its unit ("850 ms", "1.2 s")
TIME_UNIT = re.compile(r"\d\s*(ms|msecs?|milliseconds?|s|secs?|seconds?|mins?|minutes?)\b", re.IGNORECASE)

# ---- model names ------------------------------------------------------------------------------------------------
REMARKS = re.compile(r"\([^)]*\)")  # a remark in parentheses, left out of a name
NON_ALNUM = re.compile(r"[^a-z0-9]")  # what a normalised (lower-case) name drops
NAME_SPLIT = re.compile(r"[\s\-_/]+")  # the words of a name
SIZE_TOKEN = re.compile(r"^(?:[a-z]?\d+(?:\.\d+)?|\d+x\d+(?:\.\d+)?)[bmt]$")  # 70b, a22b, 1.16b, 125m, 8x7b, 1t
NAME_WORDS = {"instruct", "chat", "base", "hf", "it", "dense"}  # release words that name no family
# a trailing release word of a name: "-Instruct", "-hf", "-v0.1"
NAME_SUFFIXES = re.compile(r"[-_ ]?(instruct|chat|base|hf|it|v\d+(\.\d+)?)$", re.I)
# a name that says its model departs from its family's convention: gated MLP, grouped / multi-query attention, MoE
DEPARTS = re.compile(r"swiglu|geglu|\bglu\b|gqa|mqa|grouped[-_ ]query|multi[-_ ]query|\bmoe\b|mixture|expert", re.I)

# ---- architecture text: what a record's ``arch_source`` / ``notes`` say of the fields that are not sizes ----------
# (ModelSpec field, value, pattern), first match per field wins (record_fields.stated_arch); a negation first
ARCH_TEXT: tuple[tuple[str, object, re.Pattern[str]], ...] = (
    ("qkv_bias", False, re.compile(r"\b(?:no|without)\s+(?:qkv\s+|linear\s+)?bias", re.I)),
    ("qkv_bias", True, re.compile(r"(?:qkv|query[-_ ]key[-_ ]value)\b[^.;]{0,30}\bwith\s+(?:a\s+)?bias", re.I)),
    ("linear_bias", False, re.compile(r"\b(?:no|without)\s+(?:linear\s+)?bias", re.I)),
    ("linear_bias", True, re.compile(r"\bwith\s+(?:a\s+)?bias|\bbias(?:es)?\s+on\s+(?:every|all)", re.I)),
    ("position_embedding", "learned", re.compile(r"learned\s+(?:absolute\s+)?position", re.I)),
    ("position_embedding", "rope", re.compile(r"\brope\b|\brotary", re.I)),
    ("tied_embeddings", False, re.compile(r"\buntied\b|\buntie[sd]?\b|\bnot\s+tied", re.I)),
    ("tied_embeddings", True, re.compile(r"\btied\s+(?:input\s+|word\s+)?embedding", re.I)),
    ("dropout", False, re.compile(r"\bno\s+dropout|dropout\s*(?:=|of|:)?\s*0(?:\.0*)?(?![.\d])", re.I)),
    ("dropout", True, re.compile(r"dropout\s*(?:=|of|:)?\s*0?\.0*[1-9]", re.I)),
)

# ---- hardware text ------------------------------------------------------------------------------------------------
# GPU name (as the source prints it) → system preset. Ordered: the first pattern that matches wins.
GPU_SYSTEMS: tuple[tuple[str, str], ...] = (
    (r"GB300", "gb300"),
    (r"GB200", "gb200"),
    (r"GH200", "gh200"),
    (r"B300", "b300"),
    (r"B200", "b200"),
    (r"H200", "h200"),
    (r"H800", "h800"),
    (r"A800", "a800"),
    (r"H20(?!\d)", "h20"),  # H20, 8xH20; not H200 / GH200
    (r"MI250X", "mi250x"),  # one GCD per GPU, as ROCm counts them
    (r"MI300X?\b", "mi300x"),
    (r"MI325X", "mi325x"),
    (r"MI355X", "mi355x"),
    (r"L40S", "l40s"),
    (r"(?i)RTX[- ]?(PRO[- ])?6000[- ](PRO[- ])?Blackwell", "rtx-pro-6000"),  # the Server Edition; not RTX 6000 Ada
    (r"H100.*PCI", "h100-pcie"),
    (r"H100.*96\s*GB", "h100-96gb"),
    (r"H100", "h100"),
    (r"A100.*40\s*GB", "a100-40gb"),
    (r"A100", "a100"),
    (r"V100.*SXM2", "dgx1-v100"),  # the SXM2 part ships on the cube-mesh boards (DGX-1, HGX-1); SXM3 on DGX-2
    (r"V100", "v100"),
)
A100_TEXT = re.compile(r"A100", re.I)
A100_80GB_TEXT = re.compile(r"80\s*GB", re.I)
MEMORY_SIZE_TEXT = re.compile(r"\d+\s*GB", re.I)  # a GPU name that states its memory
YEAR = re.compile(r"\b(20[12]\d)\b")  # a year in a source's citation
BLACKWELL = re.compile(r"B[23]00")  # B200, GB200, B300, GB300

# The inter-node network a record's ``interconnect`` text states, where it differs from the preset's. Rates are per
# direction; a count of NICs or links is per server unless the text says per GPU.
# Omni-Path links run at 100 Gb/s (Intel Omni-Path Architecture 100 series), ConnectX-6 HCAs at HDR's 200 Gb/s.
NETWORK_TEXT: tuple[tuple[str, str, bool, int | None], ...] = (  # (regex, what it counts, per server, Gb/s each)
    (r"(\d+)\s*[x\u00d7]\s*(\d+)\s*gb(?:ps|/s|it)?", "count x rate per server", True, None),  # "4 x 100Gb RoCE"
    (r"(\d+)\s*(?:omni-?path\s+)?links per node", "Omni-Path links per server", True, 100),  # BLOOM's Jean Zay
    (r"(\d+)\s*connectx-6\b", "ConnectX-6 HCAs per server", True, 200),
    (r"(\d+)\s*gb(?:ps|/s)?\s*per gpu", "rate per GPU", False, None),
)

# ---- precision ------------------------------------------------------------------------------------------------
PRECISIONS: tuple[tuple[str, str], ...] = (  # first match wins, on the source's precision text
    (r"nvfp4|fp4", "fp4"),
    (r"mxfp8", "mxfp8"),
    (r"fp8|float8", "fp8"),
    (r"bf16|bfloat16", "bf16"),
    (r"fp16|float16|16-bit|half", "fp16"),
)
FP8_CURRENT_TEXT = re.compile(r"current|dynamic")  # fp8 scaled from each tensor's current amax

# ---- parallel layout, optimizer sharding and recompute (lower-case text) ---------------------------------------
# Expert-parallel all-to-all libraries: a stack that names one runs its experts expert-parallel
EP_DISPATCH_TEXT = re.compile(r"deep[-_ ]?ep|hybrid[-_ ]?ep", re.I)
NOT_INTERLEAVED = re.compile(r"\bno\b|not used|false", re.I)  # an interleaved_schedule field that says no
OVERLAP_TEXT = re.compile(r"overlap", re.I)  # an optimizer text that states an overlap
# A Megatron-LM argument that a record's parallel configuration names as given ("--overlap-grad-reduce"), not as left
# out ("no --overlap-grad-reduce", as the CI records' notes list what their runs do not give)
MEGATRON_ARGUMENT = re.compile(r"(?<!\bno )--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# "none", "no", "off": nothing sharded. A bare "DDP" is not read as this: Megatron's DDP wrapper runs under its
# distributed optimizer, which the NeMo / Megatron-Bridge tables leave unstated.
NO_SHARDING = re.compile(r"\s*(?:none|no|false|off)\b")
ZERO_STAGE = re.compile(r"zero[\s_-]*(?:stage)?[\s_:=-]*([0-3])\b")
FSDP_TEXT = re.compile(r"fsdp|hsdp|hybrid.shard|full.shard")
ZERO1_TEXT = re.compile(r"zero stage 1|zero-1|bf16_optimizer")
# fms-fsdp's block-level "selective" checkpoint (map_training.every_nth_block): whole blocks, every n-th of them
BLOCK_LEVEL = re.compile(r"block[- ]level|every\s+n-?th")
NO_RECOMPUTE = re.compile(r"\b(no|not|without)\s+(activation\s+)?(recompute|recomputation|checkpoint)")
# what a recompute field says beside its setting: the unstated words, "not selective" / "not full"
RECOMPUTE_REMARKS = re.compile(UNSTATED_WORDS + r"|\bnot\s+(selective|full)")

# ---- kernels the framework text names ---------------------------------------------------------------------------
# an eager stack whose element-wise work runs fused: compiled, or with the fused norm / activation / rotary kernels
# its text names (Apex, xFormers' SwiGLU, flash-attn's layer norm and rotary, Liger)
FUSED_KERNELS_TEXT = re.compile(
    r"torch\.compile|\bapex\b|\bliger\b|fused\s+(?:layer\s*norm|rms\s*norm|swiglu|rotary|rope|ops|kernels)", re.I)
# a run that says it ran without torch.compile (KempnerForge's "compile=false" for one experiment of a sweep that
# otherwise compiled: kf-13b-fsdp8), whatever its framework text names
NO_COMPILE_TEXT = re.compile(r"\bcompile(?:_model)?\s*=\s*false\b", re.I)
# The attention kernel a record's stack names (its ``framework`` text), where its source profile would guess:
# FlashAttention-3, cuDNN's fused attention or Transformer Engine's (which runs cuDNN's) are one family ("fused");
# FlashAttention-2, flash-attn's package and xFormers the other ("fa2"). PyTorch's SDPA is either, by release
# (sources.SDPA_CUDNN_FROM). A negated name ("no TE", "Transformer Engine disabled") names nothing.
FUSED_ATTENTION_TEXT = re.compile(
    r"flash[-_ ]?att(?:entio)?n[-_ ]?v?3|\bfa[-_ ]?v?3\b|cudnn|transformer[-_ ]?engine|\bte\b", re.I)
FA2_ATTENTION_TEXT = re.compile(  # not Transformer Engine's NVTE_FLASH_ATTN switch, which picks among TE's backends
    r"flash[-_ ]?att(?:entio)?n[-_ ]?v?2|\bfa[-_ ]?v?2\b|(?<!nvte_)flash[-_]attn|xformers", re.I)
# PyTorch's FlexAttention: Triton kernels of the FlashAttention-2 algorithm that a score or mask function is compiled
# into, at 90 % of FlashAttention-2's forward and 85 % of its backward (PyTorch blog "FlexAttention: The Flexibility of
# PyTorch with the Performance of FlashAttention", Aug 2024): the FlashAttention-2 class, whatever else the text names
FLEX_ATTENTION_TEXT = re.compile(r"flex[-_ ]?att(?:entio)?n", re.I)
SDPA_TEXT = re.compile(r"\bsdpa\b|scaled[-_ ]dot[-_ ]product[-_ ]attention", re.I)
NEGATED_KERNEL_TEXT = re.compile(
    r"\b(?:no|without|disabled?)\s+(?:te|transformer[-_ ]?engine|cudnn)\b"
    r"|\b(?:te|transformer[-_ ]?engine|cudnn)\s+(?:disabled|off)\b", re.I)
# PyTorch 2.x as a framework text spells it ("PyTorch 2.4", "torch==2.11.0"); not an NGC tag ("PyTorch 24.07")
TORCH_VERSION = re.compile(r"\b(?:py)?torch\s*(?:==|-|v)?\s*(2)\.(\d+)\b", re.I)
# flash attention turned off: flash-attn's or Megatron's switch, Hugging Face's eager attention, or both of
# Transformer Engine's flash and fused backends off (NVTE_FLASH_ATTN=0 alone leaves TE on cuDNN's fused kernel)
NO_FLASH_TEXT = re.compile(
    r"(?<!\w)(?:use_)?flash[-_]?attn\w*\s*[=:]\s*(?:0|false|no|off)\b|--no[-_]flash[-_]?attn"
    r"|\b(?:no|without)\s+flash[-_ ]?att(?:entio)?n|flash[-_ ]?att(?:entio)?n\s+(?:off|disabled)"
    r"|attn_implementation\s*[=:]\s*[\"']?eager"
    r"|nvte_flash_attn\s*=\s*0.*nvte_fused_attn\s*=\s*0|nvte_fused_attn\s*=\s*0.*nvte_flash_attn\s*=\s*0", re.I)
# Megatron's own switch (--use-flash-attn, a launch script's USE_FLASH_ATTN) where the text names Megatron-Core's
# models on Transformer Engine: the switch reaches the legacy model only, and the TE layer spec's TEDotProductAttention
# picks its fused backend itself (ROCm/Megatron-LM examples/llama/train_llama2.sh: USE_FLASH_ATTN=0 only leaves out
# --use-flash-attn, while TE_FP8=1 passes --transformer-impl=transformer_engine and MCORE=1 --use-mcore-models;
# ROCm/Megatron-LM @2b855baf: args.use_flash_attn is read by megatron/legacy/model/transformer.py only, and
# megatron/core/models/gpt/gpt_layer_specs.py's TE spec sets core_attention=TEDotProductAttention)
MEGATRON_FLASH_SWITCH = re.compile(r"(?<!\w)use_flash_attn\s*[=:]\s*(?:0|false)\b|--no[-_]flash[-_]?attn", re.I)
TE_CORE_TEXT = re.compile(r"megatron[-_ ]core.*transformer[-_ ]?engine|transformer[-_ ]?engine.*megatron[-_ ]core",
                          re.I)
# flash attention turned on where the source's default predates it ("--use-flash-attn-v2", "FlashAttention-2")
FLASH_TEXT = re.compile(r"(?<!nvte_)flash[-_ ]?att(?:entio)?n|\bfa[-_ ]?v?[23]\b", re.I)

# ---- FLOP accounting text (flops.flops_basis) -------------------------------------------------------------------
# (pattern, basis), first match wins: ``eq3`` Narayanan et al. 2021 eq. 3 (counts recompute), ``model`` Megatron /
# NeMo model FLOPs, ``palm`` PaLM App. B (6·N + 12·l·h·s per token, as torchtitan / nanotron count)
FLOPS_BASIS_TEXT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"96\*B|Eq\.?\s*\(?3|includes recompute|4\*2 coefficient", re.I), "eq3"),
    # "model FLOPs utilization (MFU; Chowdhery et al.)": PaLM's
    (re.compile(r"\bpalm\b|chowdhery", re.I), "palm"),
    (re.compile(r"model[ -]flops|model tflop|nemo|megatron|no recompute flops", re.I), "model"),
    (re.compile(r"\b6\s*\*?\s*N\b|\b6ND\b|12\s*\*?\s*l\s*\*?\s*h|chinchilla", re.I), "palm"),
    (re.compile(r"mfu", re.I), "model"),
)

# ---- recipes: the models and stacks a recipe setting applies to ---------------------------------------------------
# the MoE models whose MXFP8 Blackwell recipes switched to full-iteration CUDA graphs with the fused grouped MLP; the
# Nemotron 3 recipes keep per-layer graph scopes (attn, mamba, moe_router, moe_preprocess: nemotron_3_workload_base_
# configs.py, and the 26.08 perf_recipes/nemotronh), outside which the experts stay host-launched (recipes.expert_gemm)
FULL_ITERATION_MOE = re.compile(r"qwen3|gpt-oss|deepseek-v3", re.I)
# the stacks whose recipes train a model's multi-token-prediction depths by default, on "group framework"
# (recipes.mtp_layers)
MTP_STACKS = re.compile(r"megatron|nemo(?!.*automodel)", re.I)

# ---- releases -------------------------------------------------------------------------------------------------
BRIDGE_RELEASE = re.compile(r"megatron_bridge_(\d+)\.(\d+)")  # a Megatron-Bridge release in a group name

# ---- InternEvo (source_internevo.py) --------------------------------------------------------------------------
INTERNEVO = re.compile(r"internevo", re.I)  # a record of InternEvo's tables: id, group, source or framework
# its ZeRO-1 group's size (configs/7B_sft.py parallel zero1): -1 the whole data-parallel group, else that many ranks
ZERO1_SIZE = re.compile(r"zero1\s*=\s*(-?\d+)\b")
