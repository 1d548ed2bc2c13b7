"""``meshplan plan --system h100:32,a100:32``: the search on a mixed cluster (search/mixed.py), its options checked
against what a mixed search takes."""

from __future__ import annotations

from typing import Any

from meshplan.cli.common import progress
from meshplan.errors import SpecError

# options of plan that a mixed search does not take (one GPU count, no budget ranking across counts, no config file)
REFUSED = ("tokens", "price", "mtbf", "all_plans", "emit_format", "stragglers", "power_cap", "background")


def check_mixed(gpus: str | None, total: int, options: dict[str, Any]) -> None:
    """``--gpus`` is the pools' sum where given; the options a mixed search does not take are refused."""
    if gpus is not None and gpus.strip() != str(total):
        raise SpecError(f"gpus={gpus}: the pools of --system hold {total} GPUs (leave --gpus out, or give {total})")
    for name in REFUSED:
        if options.get(name) not in (None, False):
            flag = {"all_plans": "--all", "emit_format": "--emit"}.get(name, "--" + name.replace("_", "-"))
            raise SpecError(f"{flag} is not taken with a mixed cluster (--system preset:GPUs,…): plan one at a time")


def run_mixed(model: Any, system_ref: str, global_batch: int, settings: dict[str, Any], top_k: int,
              as_json: bool) -> None:
    """Search ``model`` on the pools of ``system_ref`` at ``global_batch`` and print the result."""
    from meshplan.report.mixed_text import print_mixed
    from meshplan.search.mixed import mixed_search
    from meshplan.search.space import Space
    from meshplan.specs.pools import parse_pools

    pools = parse_pools(system_ref)
    precision = settings.pop("precision") or min(p.system.accelerator.default_precision for p in pools.pools)
    space = Space(**settings, precision=precision, global_batch=global_batch)
    with progress(as_json):
        result = mixed_search(model, pools, space, top_k=top_k)
    print_mixed(result, as_json)
