"""Which published runs are evaluated and on which side of the efficiency fit each falls: a source group's records,
the superseded ones left out on request, and the fixed half of the runs the efficiency constants were fitted on.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any


def in_fit_set(run_id: str) -> bool:
    """The fixed half of the runs the efficiency constants were fitted on: CRC-32 of the id is even.

    A hash split (rather than a split by group) puts every source and GPU on both sides; the other half is
    the out-of-sample check. See efficiency.py and docs/ACCURACY.md.
    """
    return zlib.crc32(run_id.encode()) % 2 == 0


def select(records: Iterable[dict[str, Any]], group: str | None = None, exclude_superseded: bool = False
           ) -> list[tuple[dict[str, Any], str]]:
    """(record, skip reason or "") for the records of ``group`` (all when None). A superseded record (older
    numbers of a configuration that a newer record of the same source also gives) is still a measured run of
    the software of its day, so it is evaluated unless ``exclude_superseded``; the constants are fitted on the
    newer records only (benchmarks/measure/fit_efficiency.py)."""
    chosen = []
    for r in records:
        if group is not None and r.get("group") != group:
            continue
        reason = "superseded by a newer record of the same configuration (--exclude-superseded)" if (
            r.get("superseded") and exclude_superseded) else ""
        chosen.append((r, reason))
    return chosen
