"""The printed program's own price: the plan as program.py writes it, where that differs from the plan.

program.py gives each mesh dimension one role (tensor parallel, FSDP, replicate, none) and writes every parameter
as its dimension's role writes it: a ColwiseParallel or RowwiseParallel split where the dimension is tensor
parallel, ``fully_shard``'s Shard(0) where it shards (torch.distributed.fsdp.fully_shard shards each parameter on
dimension 0), whole elsewhere; the plan's other splits are the "# not written" lines of the program. Here each
parameter is pinned to the placement the program writes (where a strategy of its node has it) and the integer
program is solved again for the rest, under the same memory limit: the step time of the program as printed, with
the best placement of the activations given those parameters. Where the program writes every parameter as the plan
holds it, this is the plan itself (no second solve). The second solve's first round starts HiGHS from the plan's
first round's optimal basis (Sharding.basis, by name: highs.py), the same program but for the pinned parameters.

Still not priced: a fused projection whose output the program gathers (program._gathered: the ops between run whole
on every rank), which no parameter placement expresses; ``left_out`` names it.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.autoshard.output import params
from meshplan.autoshard.placement import Placements
from meshplan.autoshard.program import TP_STYLES, roles, unwritten_lines
from meshplan.autoshard.solve import Sharding, collector_paused, plan


@dataclass(frozen=True)
class AsWritten:
    """The program's sharding (the plan itself where it writes the plan whole), the parameters it writes otherwise
    and the lines that say what the program leaves out of the plan."""

    sharding: Sharding
    changed: tuple[str, ...]  # parameters written otherwise than the plan holds them
    left_out: tuple[str, ...]  # the program's "# not written" lines
    # a gathered fused output (the ops between run whole), or a parameter no strategy holds as written (priced as
    # planned): the program's step is slower than this price by those
    unpriced: bool


def written(placements: Placements, styles: tuple[str, ...], role: tuple[str, ...]) -> Placements:
    """A parameter's placements as the program writes them (module docstring)."""
    out = []
    for x, style, r in zip(placements, styles, role, strict=True):
        if r == "tp":
            out.append(x if style in TP_STYLES else -1)
        elif r == "shard":
            out.append(0)
        else:
            out.append(-1)
    return tuple(out)


def as_written(sharding: Sharding) -> AsWritten:
    """The program's price (module docstring)."""
    problem = sharding.problem
    plans = params(sharding)
    role = roles(plans, len(problem.mesh.names))
    keys = [k for k, node in sorted(problem.nodes.items()) if node.kind == "param"]
    allowed: dict[int, set[int]] = {}
    changed, unmatched = [], False
    for key, pp in zip(keys, plans, strict=True):
        want = written(pp.placements, pp.styles, role)
        if want == tuple(pp.placements):
            continue
        node = problem.nodes[key]
        fits = {a for a, outs in enumerate(node.outs) if tuple(outs[(key, 0)]) == want}
        if fits:
            allowed[key] = fits
            changed.append(pp.name)
        unmatched |= not fits  # no strategy of its node holds it as written: priced as planned
    lines = tuple(unwritten_lines(sharding))
    unpriced = unmatched or any(line.startswith("# not written as planned") for line in lines)
    if not allowed:
        return AsWritten(sharding, (), lines, unpriced)
    with collector_paused():
        again = plan(problem, sharding.memory_limit, sharding.micro_batches, allowed=allowed, start=sharding.basis)
    return AsWritten(again, tuple(dict.fromkeys(changed)), lines, unpriced)
