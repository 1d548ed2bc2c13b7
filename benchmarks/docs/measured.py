"""The model zoo predicted and measured on this machine: writes data/measured/<date>-<machine>.jsonl.gz (every
model's step and per-op profile) and docs/MEASURED.md (rendered from that file, with the learned model's
leave-one-model-out evaluation).

    python benchmarks/docs/measured.py                       # the whole zoo: about 3 minutes on a quiet 2-core host
    python benchmarks/docs/measured.py --models gpt2,vit     # some of it (the data file then holds those only)
    python benchmarks/docs/measured.py --render data/measured/2026-11-25-intel-xeon-processor-2c.jsonl.gz

Each model runs check-step's measurement (meshplan.measure.check: one thread, the process's CPU time, glibc
keeping freed memory, ``--rounds`` interleaved rounds of replaying the calibration and timing the step). The
figures move with the machine's load (os.getloadavg, reported per model): run it when the machine is quiet.
tests/test_docs.py re-renders docs/MEASURED.md from the committed data file and compares; it does not measure.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measured_doc import render  # noqa: E402
from meshplan.measure.records import read_profiles, write_profile  # noqa: E402

DOC = ROOT / "docs" / "MEASURED.md"
DATA = ROOT / "data" / "measured"


def machine_slug(name: str, cores: int) -> str:
    """``Intel(R) Xeon(R) Processor (CPU)``, 2 cores → ``intel-xeon-processor-2c``."""
    words = re.sub(r"\((R|TM|CPU)\)", " ", name, flags=re.IGNORECASE)
    slug = re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")
    return f"{slug}-{cores}c"


def measure(models: list[str], rounds: int, data: Path | None = None, device: str = "cpu") -> list:
    """Each model's check-step result; with ``data``, the file is rewritten after each model (a run cut short keeps
    the models it finished)."""
    from meshplan.measure.check import CheckSettings
    from meshplan.measure.command import check_step_ref

    results = []
    for name in models:
        start = time.time()
        result = check_step_ref(name, settings=CheckSettings(rounds=rounds, device=device))
        results.append(result)
        print(f"{name:10s} predicted {result.prediction.seconds * 1e3:7.1f} ms, measured "
              f"{result.measurement.timing.seconds * 1e3:7.1f} ms ({result.error:+.1%}); Python glue "
              f"{result.prediction.glue * 1e3:.2f} ms; peak memory "
              f"{result.memory_error:+.2%}; load {result.measurement.timing.load_before:.2f}; "
              f"{time.time() - start:.0f} s", flush=True)
        if data is not None:
            write_profile(data, results)
    return results


def main(argv: list[str] | None = None) -> int:
    from meshplan_research.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated zoo names")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved calibrate / measure rounds per model")
    parser.add_argument("--render", default=None, help="only render docs/MEASURED.md from this data file")
    parser.add_argument("--doc", default=str(DOC))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the steps run (cuda: the wall "
                        "clock and the GPU; docs/MEASURED.md is the CPU's)")
    parser.add_argument("--data", default=None, help="the data file to write (default: data/measured/<date>-<machine>"
                        ".jsonl.gz), rewritten after each model")
    args = parser.parse_args(argv)
    if args.render:
        data = Path(args.render)
        data = data if data.is_absolute() or data.exists() else ROOT / data
    else:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        results = measure(models, args.rounds, Path(args.data) if args.data else None, args.device)
        mach = results[0].machine
        data = Path(args.data) if args.data else (
            DATA / f"{datetime.date.today().isoformat()}-{machine_slug(mach['name'], mach['cores'])}.jsonl.gz")
        write_profile(data, results)
        print(f"wrote {data}")
    data = data.resolve()
    text = render(read_profiles(data), data.relative_to(ROOT) if data.is_relative_to(ROOT) else data)
    Path(args.doc).write_text(text)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
