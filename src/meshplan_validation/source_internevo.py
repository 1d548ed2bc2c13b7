"""What InternEvo's ZeRO-1 does with the updated weights (its documentation's performance tables, provenance.py
"internevo"): the code of InternLM/InternEvo c628a8c87411 (2024-03-28), the optimizer the records' reading cites.

HybridZeroOptimizer.broadcast_params (internlm/solver/optimizer/hybrid_zero_optim.py, lines 809-837) sends the
updated 16-bit shards with one ``dist.broadcast`` per rank of the ZeRO group, async on that group, after the step
(``self.broadcast_params()`` at the end of ``_step``), and waits for them unless overlap_sync_param, which the 7B
configuration leaves off (configs/7B_sft.py: hybrid_zero_optimizer overlap_sync_param=False): the
"shard_broadcasts" weight sync (step/param_sync.py), exposed before the next forward (overlap_param_gather false).

Mapped where the ZeRO group is the whole data-parallel group (the record's zero1=-1: "the size of the zero process
group is equal to the size of the dp process group", configs/7B_sft.py): a Plan has no ZeRO group of its own, so
the zero1=8 / zero1=4 runs, whose broadcasts stay inside a node, keep the all-gather over the data-parallel group.
"""

from __future__ import annotations

from typing import Any

from meshplan_validation.patterns import INTERNEVO, ZERO1_WHOLE_GROUP


def internevo_sync(record: dict[str, Any], zero: int, notes: list[str]) -> dict[str, Any]:
    """The Stack settings of InternEvo's weight broadcasts for a record of its ZeRO-1 over the whole data-parallel
    group (module docstring); {} for any other record."""
    text = " ".join(str(record.get(k) or "") for k in ("id", "group", "source", "framework"))
    sharding = str((record.get("parallel") or {}).get("zero_or_fsdp") or "")
    if zero not in (1, 2) or not INTERNEVO.search(text) or not ZERO1_WHOLE_GROUP.search(sharding):
        return {}
    notes.append("updated weights sent as one broadcast per ZeRO rank after the step, exposed (InternEvo "
                 "HybridZeroOptimizer.broadcast_params @c628a8c; overlap_sync_param=False)")
    return {"param_sync": "shard_broadcasts", "overlap_param_gather": False}
