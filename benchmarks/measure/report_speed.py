"""Time the README's report command end to end, as a user runs it (issue 48 item 12: 10.8 s on a quiet machine,
target <= 2 s): `meshplan report --model llama3-70b --system h100 --gpus 256 -o report.html`, a fresh process each
run (interpreter start and imports included), the best of five; the first run may also bundle the charts' runtime
into the user's cache directory (report/vega.py), which later runs read.

Run: python benchmarks/measure/report_speed.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = ["report", "--model", "llama3-70b", "--system", "h100", "--gpus", "256"]
RUNS = 5


def main() -> None:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        for _ in range(RUNS):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "meshplan.cli", *COMMAND, "-o", str(out)], check=True,
                           capture_output=True)
            times.append(time.perf_counter() - start)
    print(f"meshplan {' '.join(COMMAND)} -o report.html")
    print(f"  best of {RUNS}: {min(times):.2f} s   median: {sorted(times)[RUNS // 2]:.2f} s   (target: <= 2 s)")


if __name__ == "__main__":
    main()
