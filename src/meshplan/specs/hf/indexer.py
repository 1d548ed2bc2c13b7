"""DeepSeek Sparse Attention's lightning indexer, read off a meta-device MLA module (modules.py) and turned into
ModelSpec's ``index_*`` fields (sizes.py): transformers' DeepseekV32Indexer (models/deepseek_v32/, and GLM-MoE-DSA's,
AXK2's and dots3's copies) holds wq_b (q_lora_rank → n_i·d_i), wk (H → d_i), k_norm (a LayerNorm of d_i with bias) and
weights_proj (H → n_i), all without linear biases; index_topk (the keys each query keeps) and the head count come
from the config (``index_topk``, ``index_n_heads``).
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError


def read_indexer(module: Any, hidden: int) -> tuple[dict[str, int], list[str]]:
    """(heads, head_dim, q_in) of an indexer module and the weights it holds beyond the four it should."""
    shapes = {n: tuple(int(x) for x in p.shape) for n, p in module.named_parameters()}
    wk, weights = shapes.get("wk.weight", (0, 0)), shapes.get("weights_proj.weight", (0, 0))
    dim, heads = wk[0], weights[0]
    q = shapes.get("wq_b.weight", (0, 0))
    want = {"wq_b.weight": (heads * dim, q[1]), "wk.weight": (dim, hidden), "weights_proj.weight": (heads, hidden),
            "k_norm.weight": (dim,), "k_norm.bias": (dim,)}
    bad = [f"{n} {shape}" for n, shape in shapes.items() if want.get(n) != shape]
    bad += [f"(no {n})" for n in want if n not in shapes]
    return {"heads": heads, "dim": dim, "q_in": q[1]}, bad


def indexer_fields(cfg: Any, sizes: dict[str, int] | None, q_lora_rank: int, where: str) -> dict[str, int]:
    """ModelSpec's index_heads, index_head_dim and index_topk for an MLA block with an indexer ({} without one)."""
    if sizes is None:
        return {}
    topk, heads = getattr(cfg, "index_topk", None), getattr(cfg, "index_n_heads", None)
    if not isinstance(topk, int) or topk <= 0:
        raise SpecError(f"{where}: the attention has a DSA indexer but the config has no index_topk")
    if heads != sizes["heads"] or sizes["q_in"] != q_lora_rank:
        raise SpecError(f"{where}: the DSA indexer has {sizes['heads']} heads reading {sizes['q_in']} channels; the "
                        f"config says index_n_heads={heads}, q_lora_rank={q_lora_rank}")
    return {"index_heads": sizes["heads"], "index_head_dim": sizes["dim"], "index_topk": topk}
