"""The plan as a PyTorch program that runs as printed: imports, the device mesh, ``parallelize_module`` on the
tensor-parallel mesh dimension, then data parallelism on the others, composed as torchtitan composes them
(torchtitan/models/llama3/infra/parallelize.py: tensor parallelism first, then ``fully_shard`` over the
data-parallel mesh, a 2-D ``mesh["dp_replicate", "dp_shard"]`` for HSDP).

Each mesh dimension of the plan takes one role:

- **data parallel** where the op reading some parameter splits the batch there: ``shard`` (FSDP) if such a
  parameter is sharded there, ``replicate`` (DDP) if every one is whole;
- **tensor parallel** where no op splits the batch and some parameter is ColwiseParallel or RowwiseParallel;
- **none** otherwise (every rank along it runs the same step).

One program, one role per dimension, because PyTorch's composable APIs compose that way: ``fully_shard`` and
``replicate`` manage whole modules and refuse a module already managed by the other ("Cannot apply replicate() on a
Module already managed by fully_shard"), HSDP is one ``fully_shard`` over a 2-D mesh whose dimension 0 replicates
and dimension 1 shards (torch.distributed.fsdp.fully_shard's docstring), and FSDP shards a tensor-parallel DTensor
over the other dimensions of the same mesh. A parameter the plan splits in a way its dimension's role cannot write
(a ColwiseParallel on a data-parallel dimension, a Shard on a dimension that replicates it) is written as that role
writes it, and a comment says which. Dimensions of one role are merged into one mesh dimension, and the mesh's
dimensions ordered replicate, shard, tensor parallel, none (HSDP's order), by a ``DeviceMesh`` over the same ranks.
"""

from __future__ import annotations

from collections import defaultdict
from math import prod
from typing import TYPE_CHECKING

from meshplan.autoshard.output import ParamPlan, fused_parts, is_norm, params, sequence_parallel

if TYPE_CHECKING:
    from meshplan.autoshard.solve import Sharding

TP_STYLES = ("ColwiseParallel", "RowwiseParallel")
ORDER = ("replicate", "shard", "tp", "none")
WHAT = {"replicate": "replicates (data parallel)", "shard": "shards parameters (FSDP)", "tp": "tensor parallel",
        "none": "runs the same step on every rank"}


def roles(plans: list[ParamPlan], ndim: int) -> tuple[str, ...]:
    """Each mesh dimension's role (module docstring): data parallel or tensor parallel by which holds more of the
    model's parameters (tied layers counted once per layer of the full model) where the plan does both."""
    out = []
    for dim in range(ndim):
        batch = [pp for pp in plans if pp.batch and pp.batch[dim]]
        dp = sum(_numel(pp) for pp in batch)
        tp = sum(_numel(pp) for pp in plans if pp.styles[dim] in TP_STYLES)
        if dp > 0 and dp >= tp:
            out.append("shard" if any(pp.placements[dim] >= 0 for pp in batch) else "replicate")
        else:
            out.append("tp" if tp > 0 else "none")
    return tuple(out)


def _numel(pp: ParamPlan) -> int:
    return prod(pp.shape) * pp.count


def _mesh(names: tuple[str, ...], sizes: tuple[int, ...], role: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The mesh lines and the name of each role's (merged) dimension."""
    order = sorted(range(len(names)), key=lambda d: (ORDER.index(role[d]), d))
    groups = [[d for d in order if role[d] == r] for r in ORDER]
    groups = [g for g in groups if g]
    merged = ["_".join(names[d] for d in g) for g in groups]
    shape = tuple(prod(sizes[d] for d in g) for g in groups)
    quoted = ", ".join(f'"{n}"' for n in merged) + ("," if len(merged) == 1 else "")
    said = ", ".join(f"{names[d]} {WHAT[role[d]]}" for d in range(len(names)))
    lines = [f"# the plan's mesh {' x '.join(f'{n} {s}' for n, s in zip(names, sizes, strict=True))}: {said}"]
    if order == list(range(len(names))) and len(groups) == len(names):
        lines.append(f'mesh = init_device_mesh("cuda", {tuple(sizes)}, mesh_dim_names=({quoted}))')
    else:
        reorder = f".permute{tuple(order)}" if order != list(range(len(names))) else ""
        merge = f".reshape{shape}" if len(shape) < len(names) else ""
        lines.append(f"ranks = torch.arange({prod(sizes)}).reshape{tuple(sizes)}{reorder}{merge}"
                     "  # the same ranks, dimensions of one role merged, replicate before shard")
        lines.append(f'mesh = DeviceMesh("cuda", ranks, mesh_dim_names=({quoted}))')
    return lines, {role[g[0]]: m for g, m in zip(groups, merged, strict=True)}


def _tp_plan(sharding: Sharding, plans: list[ParamPlan], tp_dims: list[int], mesh_name: str) -> list[str]:
    """``parallelize_module`` on the tensor-parallel dimension, with the layouts torchtitan writes
    (torchtitan/models/llama3/infra/parallelize.py, apply_tp): a ColwiseParallel linear and a RowwiseParallel one
    under the same parent are a pair (the hidden split passes between them as local tensors); a linear without its
    pair gathers its output (Colwise) or slices its whole input (Rowwise); an embedding's output is whole, or split
    along the sequence where the plan keeps the norms so (sequence parallelism: the pairs' inputs and outputs
    Shard(1), the norms SequenceParallel)."""
    styled: dict[str, set[str]] = defaultdict(set)
    embeddings = set()
    for pp in plans:
        module, leaf = pp.name.rsplit(".", 1)
        for dim in tp_dims:
            if pp.styles[dim] in TP_STYLES and leaf in ("weight", "bias"):
                styled[module].add(pp.styles[dim])
                embeddings |= {module} if pp.reader == "embedding" else set()
    if not styled:
        return []
    sp = all(sequence_parallel(sharding, dim) for dim in tp_dims)
    parents: dict[str, set[str]] = defaultdict(set)
    for module, styles in styled.items():
        parents[_parent(module)] |= styles
    packed, whole = _fused(sharding, styled, prod(sharding.problem.mesh.sizes[d] for d in tp_dims))
    lines = [*_pack(packed, mesh_name), *_gathered(whole), f'parallelize_module(model, mesh["{mesh_name}"], {{']
    for module, styles in sorted(styled.items()):
        style = sorted(styles)[0]
        paired = set(TP_STYLES) <= parents[_parent(module)] and module not in whole
        if module in embeddings:
            args = ["output_layouts=Shard(1)" if sp else "output_layouts=Replicate()"] * (style == "ColwiseParallel"
                                                                                        or sp)
        elif style == "ColwiseParallel":
            args = ["input_layouts=Shard(1)"] * sp + ["output_layouts=Replicate()"] * (not paired)
        else:
            args = ["input_layouts=Replicate()"] * (not paired) + ["output_layouts=Shard(1)"] * sp
        lines.append(f'    "{module}": {style}({", ".join(args)}),')
    if sp:
        norms = sorted({pp.name.rsplit(".", 1)[0] for pp in plans if is_norm(pp.name.rsplit(".", 1)[0])})
        lines.extend(f'    "{m}": SequenceParallel(),' for m in norms)
    lines.append("})")
    return lines


def _parent(module: str) -> str:
    return module.rsplit(".", 1)[0] if "." in module else ""


def _fused(sharding: Sharding, styled: dict[str, set[str]], tp: int) -> tuple[dict[str, int], dict[str, str]]:
    """Fused projections: a ColwiseParallel linear whose output the forward cuts into parts along its features. The
    plan prices Megatron-LM's packed layout (views.py: each rank holds its share of every part). Chunked into equal
    parts (``chunk``, aten's ``split``), the forward's local chunks are the rank's shares where the weight's rows are
    packed so (vLLM's MergedColumnParallelLinear loads each part's tp_rank slice into the rank's weight,
    vllm/model_executor/layers/linear.py): ``packed``, module -> parts. Cut by the whole tensor's widths
    (``split_with_sizes``, a slice), the forward cannot run on a share without editing it (vLLM's models split by
    per-rank widths): the output is gathered and the row-wise linears beside it slice their whole input, as
    transformers' Phi-3 plan writes them ("colwise_gather_output" / "rowwise_split_input",
    transformers/models/phi3/configuration_phi3.py): ``whole``, module -> the fused one it is, or pairs with."""
    packed: dict[str, int] = {}
    whole: dict[str, str] = {}
    for module, styles in sorted(styled.items()):
        op, parts = fused_parts(sharding, module) if "ColwiseParallel" in styles else ("", ())
        if not parts:
            continue
        if op in ("split", "chunk") and len(set(parts)) == 1 and parts[0] % tp == 0:
            packed[module] = len(parts)
            continue
        whole |= {m: module for m, s in styled.items() if m == module or (
            _parent(m) == _parent(module) and "RowwiseParallel" in s)}
    return packed, whole


def _pack(packed: dict[str, int], mesh_name: str) -> list[str]:
    if not packed:
        return []
    text = ", ".join(f'"{m}": {n}' for m, n in sorted(packed.items()))
    return [f"# {', '.join(m.rsplit('.', 1)[-1] for m in sorted(packed))}: the output chunked into equal parts; the "
            "rows packed so that each rank's ColwiseParallel shard holds its share of every part (Megatron-LM's "
            "layout; the parameters, and a checkpoint of them, hold that order)",
            f"packed = {{{text}}}", f'tp = mesh["{mesh_name}"].size()', "with torch.no_grad():",
            "    for name, module in model.named_modules():",
            "        for parts in [n for p, n in packed.items() if fnmatch(name, p)]:",
            "            for w in module.parameters():",
            "                w.copy_(w.unflatten(0, (parts, tp, -1)).transpose(0, 1).flatten(0, 2))"]


def _gathered(whole: dict[str, str]) -> list[str]:
    fused = sorted(set(whole.values()))
    return [f"# not written as planned: the plan's split of {f}'s output into its parts (each rank its share of "
            f"every part, as Megatron-LM packs it); the forward cuts it by the whole tensor's widths, so here "
            f"{', '.join(sorted(m for m, g in whole.items() if g == f))} gather their output or slice their whole "
            "input: the ops between run whole on every rank, not split as priced" for f in fused]


def _unwritten(plans: list[ParamPlan], names: tuple[str, ...], role: tuple[str, ...]) -> list[str]:
    """Comments for what the plan splits and the program cannot (module docstring)."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pp in plans:
        for dim, (style, x) in enumerate(zip(pp.styles, pp.placements, strict=True)):
            module = pp.name.rsplit(".", 1)[0]
            if style in TP_STYLES and role[dim] != "tp":
                found[(f"{style} on {names[dim]}", f"{WHAT[role[dim]].split(' (')[0]} there")].append(module)
            elif x >= 0 and role[dim] in ("replicate", "none") and style not in TP_STYLES:
                found[(f"{style} on {names[dim]}", "whole there")].append(module)
            elif role[dim] == "tp" and x >= 0 and style not in TP_STYLES:
                found[(f"{style} on {names[dim]}", "whole there (no parallel style writes it)")].append(module)
    return [f"# not written: the plan's {what} of {', '.join(sorted(set(mods)))}; here {how}"
            for (what, how), mods in sorted(found.items())]


def parallelize_code(sharding: Sharding) -> str:
    """The plan as a program (module docstring): ``model`` is the module; it runs on every rank as printed."""
    mesh = sharding.problem.mesh
    plans = params(sharding)
    role = roles(plans, len(mesh.names))
    mesh_lines, dim_of = _mesh(mesh.names, mesh.sizes, role)
    tp_dims = [d for d, r in enumerate(role) if r == "tp"]
    body = _tp_plan(sharding, plans, tp_dims, dim_of["tp"]) if tp_dims else []
    if "shard" in dim_of and "replicate" in dim_of:
        body.append(f'fully_shard(model, mesh=mesh["{dim_of["replicate"]}", "{dim_of["shard"]}"])'
                    f'  # HSDP: replicated on {dim_of["replicate"]}, sharded on {dim_of["shard"]}')
    elif "shard" in dim_of:
        body.append(f'fully_shard(model, mesh=mesh["{dim_of["shard"]}"])  # parameters sharded on '
                    f'{dim_of["shard"]}, gathered per use')
    elif "replicate" in dim_of:
        body.append(f'replicate(model, device_mesh=mesh["{dim_of["replicate"]}"])  # data parallel on '
                    f'{dim_of["replicate"]}')
    return "\n".join([*_imports(body, mesh_lines), *mesh_lines, *_unwritten(plans, mesh.names, role), *body])


def _imports(body: list[str], mesh_lines: list[str]) -> list[str]:
    text = "\n".join(body + mesh_lines)
    lines = ["import torch"] if "torch." in text else []
    mesh = "DeviceMesh" if "DeviceMesh(" in text else "init_device_mesh"
    lines.append(f"from torch.distributed.device_mesh import {mesh}")
    styles = [s for s in ("ColwiseParallel", "RowwiseParallel", "SequenceParallel") if f"{s}(" in text]
    if styles:
        lines.append(f"from torch.distributed.tensor.parallel import parallelize_module, {', '.join(styles)}")
    placements = [p for p in ("Replicate", "Shard") if f"{p}(" in text]
    if placements:
        lines.append(f"from torch.distributed.tensor import {', '.join(placements)}")
    if "fnmatch(" in text:
        lines.append("from fnmatch import fnmatch")
    if "fully_shard(" in text:
        lines.append("from torch.distributed.fsdp import fully_shard")
    if "replicate(" in text:
        lines.append("from torch.distributed._composable.replicate import replicate")
    return lines


def unwritten_lines(sharding: Sharding) -> list[str]:
    """The program's "# not written" lines: what of the plan it leaves out (as_written.py prices the rest)."""
    return [line for line in parallelize_code(sharding).splitlines() if line.startswith("# not written")]
