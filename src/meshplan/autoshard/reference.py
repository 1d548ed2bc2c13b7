"""Megatron-LM's tensor-parallel layout as a constraint on the program: the plan meshplan's analytic estimate prices.

Megatron-LM (Shoeybi et al. 2019, §3, Figure 3; Korthikanti et al. 2022, §4.2.2 for sequence parallelism) splits
the first linear of each pair by columns (its output features: QKV, the MLP's up and gate projections, the LM head
over the vocabulary) and the second by rows (its input features: the attention output and MLP down projections),
the attention by heads and the embedding by vocabulary rows; its parameters stay where they are (no gathers), and
their gradients are reduced across data-parallel ranks, which split the batch on the other mesh dimensions (and, for
the replicated norm weights under sequence parallelism, across the tensor-parallel ranks too).

``megatron`` pins exactly that: those forward ops' strategies (GEMMs by their module's name), every parameter's
placement to what its forward op reads, every other reader of a parameter to read it in place, and each gradient to
its parameter's split on the tensor-parallel dimension. Everything else is the solver's: the backward GEMMs, the
norms and the residual stream (sequence-parallel or replicated between the pairs), the loss.

The module names are those of the Hugging Face families meshplan traces (Llama, Mistral, Mixtral, Qwen: q/k/v/o,
gate/up/down; GPT-2: c_attn, c_fc, c_proj; GPT-NeoX: query_key_value, dense, dense_h_to_4h, dense_4h_to_h; the MoE
experts' 3-D gate_up_proj and down_proj) and of meshplan's own modules (torch_models.py), which use Llama's.
"""

from __future__ import annotations

from meshplan.autoshard.ops import ATTENTION, GEMMS, packet
from meshplan.autoshard.placement import PARTIAL, REPLICATE
from meshplan.autoshard.problem import Problem
from meshplan.autoshard.rules import is_pass

COLUMN = {"q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "c_attn", "c_fc", "query_key_value",
          "dense_h_to_4h", "lm_head", "embed_out", "gate_up_proj", "w1", "w3", "fc1", "wqkv"}
ROW = {"o_proj", "down_proj", "c_proj", "dense", "dense_4h_to_h", "w2", "fc2", "out_proj", "wo"}


def _free(have: tuple[int, ...] | None, want: tuple[int, ...] | None) -> bool:
    """The move costs nothing: the same placement, or slices of a replicated tensor (Replicate -> Shard / Partial)."""
    return have is not None and want is not None and all(h in (REPLICATE, w) for h, w in zip(have, want, strict=True))


def role(module: str) -> str:
    last = module.rsplit(".", 1)[-1]
    return "column" if last in COLUMN else "row" if last in ROW else ""


def _forward_pins(problem: Problem, tp: int, dp: tuple[int, ...]) -> dict[int, set[int]]:
    """The forward GEMMs, attention and embeddings, by their module's role."""
    allowed: dict[int, set[int]] = {}
    ops = problem.flow.trace.ops
    for key, node in problem.nodes.items():
        if key >= len(ops) or node.kind != "anchor" or ops[key].phase != "fwd":
            continue
        op, name = ops[key], packet(ops[key])
        kind = role(op.module) or _weight_role(problem, key)
        if name in GEMMS and kind:
            want = {tp: {"n"} if kind == "column" else {"k"}}
            batch = {"m", "b", "s"}
        elif name in ATTENTION:
            want, batch = {tp: {"h"}}, {"b"}
        elif name == "embedding":
            want, batch = {tp: {"v"}}, {"i0"}
        else:
            continue
        for d in dp:
            want[d] = batch
        keep = {a for a, combo in enumerate(node.combos) if all(combo[d] in labs for d, labs in want.items())}
        if keep:
            allowed[key] = keep
    return allowed


def _weight_role(problem: Problem, key: int) -> str:
    """The role of the parameter a GEMM reads, by the parameter's own name (transformers' MoE experts keep their
    3-D weights ``gate_up_proj`` and ``down_proj`` on one ``experts`` module)."""
    trace = problem.flow.trace
    for (u, v), _ in problem.edges.items():
        node = problem.nodes[u]
        if v == key and node.kind == "param":
            name = trace.names.get(problem.flow.sources[u - len(trace.ops)].storage, "")
            found = role(name.rsplit(".", 1)[0]) or role(name)
            if found:
                return found
    return ""


def megatron(problem: Problem, tp: int, dp: tuple[int, ...], sequence_parallel: bool = True) -> dict[int, set[int]]:
    """Allowed strategies of Megatron's plan with tensor parallelism on mesh dimension ``tp`` and the batch split
    on the mesh dimensions ``dp`` (module docstring); with ``sequence_parallel`` the norms and residual adds of the
    forward pass split the tokens (the sequence or the batch of a (batch, sequence, hidden) tensor) on ``tp``."""
    allowed = _forward_pins(problem, tp, dp)
    if sequence_parallel:
        _sequence_pins(problem, tp, allowed)
    _dispatch_pins(problem, tp, allowed)
    params = {k for k, node in problem.nodes.items() if node.kind == "param"}
    held: dict[int, int] = {}  # parameter node -> its pinned strategy
    for key in list(allowed):  # a pinned op's parameters: where it reads them
        node = problem.nodes[key]
        for (u, v), edge in problem.edges.items():
            if v != key or u not in params:
                continue
            for produced, needed, _, _ in edge.uses:
                wants = {node.needs[a][needed] for a in allowed[key]}
                outs = problem.nodes[u].outs
                fits = {b for b, o in enumerate(outs) if o.get(produced) in wants} or {
                    b for b, o in enumerate(outs) if any(_free(o.get(produced), w) for w in wants)}
                held[u] = min(fits & {held[u]} or fits) if u in held else min(fits, default=0)
    for key in params - set(held):  # norms, embeddings of positions, biases of other layers: replicated
        held[key] = next(a for a, combo in enumerate(problem.nodes[key].combos) if all(c is None for c in combo))
    for key, a in held.items():
        allowed[key] = {a}
    _readers_in_place(problem, held, allowed)
    _gradients_in_place(problem, held, tp, allowed)
    return allowed


NORMS = {"input_layernorm", "post_attention_layernorm", "norm", "ln_1", "ln_2", "ln_f", "final_layernorm",
         "post_feedforward_layernorm", "pre_feedforward_layernorm"}


def _sequence_pins(problem: Problem, tp: int, allowed: dict[int, set[int]]) -> None:
    """The forward ops of the norms and of the blocks themselves (the residual adds) keep (batch, sequence, hidden)
    results split by tokens on ``tp`` (Korthikanti et al. 2022, §4.2.2): along the sequence, or along the batch
    where it divides. Megatron-LM's activations are (sequence, batch, hidden), so its split of the sequence is a split
    of the flattened tokens into contiguous blocks; in the (batch, sequence, hidden) layout of Hugging Face models
    that is a split of the batch when one device holds whole sequences (the rows a MoE dispatch flattens stay
    local), of the sequence otherwise. Either costs the norms and the tensor-parallel collectives the same."""
    ops, blocks = problem.flow.trace.ops, problem.blocks
    prefixes = {g.prefix for g in blocks.groups}
    for key, node in problem.nodes.items():
        if key >= len(ops) or ops[key].phase != "fwd" or node.kind not in ("anchor", "source"):
            continue
        op = ops[key]
        last = op.module.rsplit(".", 1)[-1]
        block = any(op.module.startswith(p + ".") and op.module[len(p) + 1:].isdigit() for p in prefixes)
        if (last in NORMS or block) and len(op.outputs[0].shape) == 3:
            keep = {a for a, o in enumerate(node.outs) if o[(key, 0)][tp] in (0, 1)}
            if keep:
                allowed[key] = allowed.get(key, keep) & keep


def _dispatch_pins(problem: Problem, tp: int, allowed: dict[int, set[int]]) -> None:
    """Megatron-Core's all-gather token dispatcher (its default; MoEAllGatherTokenDispatcher): the tokens gathered
    across the tensor-parallel ranks before the permutation, which runs, with the weighting and the combine, on the
    gathered rows of every rank (each holds the experts' column or row shards), the experts' partial sums reduced
    to the token split after the combine. Pinned here: the ops of a MoE layer's token path (in a module that runs
    a grouped GEMM, both passes, results of hidden-wide rows: not the routing, not the experts' inner activations)
    split nothing on ``tp``, Partial sums passing through."""
    ops = problem.flow.trace.ops
    widths = {op.module: op.outputs[0].shape[-1] for op in ops if packet(op) == "_grouped_mm" and op.phase == "fwd"}
    for key, node in problem.nodes.items():
        if key >= len(ops) or node.kind not in ("anchor", "source") or ops[key].module not in widths:
            continue
        shape = ops[key].outputs[0].shape if ops[key].outputs else ()
        if packet(ops[key]) in GEMMS or len(shape) < 2 or shape[-1] != widths[ops[key].module]:
            continue
        keep = {a for a, combo in enumerate(node.combos) if combo[tp] is None or is_pass(combo[tp])}
        if keep:
            allowed[key] = allowed.get(key, keep) & keep


def _readers_in_place(problem: Problem, held: dict[int, int], allowed: dict[int, set[int]]) -> None:
    for (u, v), edge in problem.edges.items():
        if u not in held or v in held:
            continue
        for produced, needed, _, per_step in edge.uses:
            if per_step:
                continue
            have = problem.nodes[u].outs[held[u]].get(produced)
            source = problem.nodes[v].outs if problem.nodes[v].kind == "hub" else problem.nodes[v].needs
            keep = {b for b, o in enumerate(source) if _free(have, o.get(needed))}
            allowed[v] = allowed.get(v, set(range(problem.nodes[v].size))) & keep


def _gradients_in_place(problem: Problem, held: dict[int, int], tp: int, allowed: dict[int, set[int]]) -> None:
    for (u, v), edge in problem.edges.items():
        if v not in held:
            continue
        for produced, needed, _, per_step in edge.uses:
            if not per_step:
                continue
            want = problem.nodes[v].outs[held[v]][needed][tp]
            ok = {want, PARTIAL} if want == REPLICATE else {want}  # a replicated weight's gradient: all-reduced
            keep = {a for a, o in enumerate(problem.nodes[u].outs) if o.get(produced, (None,) * (tp + 1))[tp] in ok}
            allowed[u] = allowed.get(u, set(range(problem.nodes[u].size))) & keep
