"""How many Python functions one training step of each zoo model calls (docs/MEASURED_GPU.md sets them against the
host time the GPU step pays beyond its ops): the step of check-step (forward, the loss, backward, AdamW with
``foreach``, as on a GPU, ``zero_grad``) run on this CPU after two warm-up steps, counted by ``sys.setprofile``:
``call`` events (a Python frame entered: module forward bodies, Hugging Face helpers, the optimizer's Python) and
``c_call`` events (a C function called from Python: torch's bindings, builtins). The counts do not depend on the
machine's speed; they can on the device where a library takes another Python path (attention selection), and on the
library versions, which the file records.

    python benchmarks/measure/python_calls.py --out data/measured/gpu/2026-11-26-python-calls.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def count(name: str) -> dict[str, int]:
    """Python and C calls of one step of the zoo model ``name`` on the CPU."""
    import torch

    from meshplan.measure.command import load_target
    from meshplan.measure.step import make_step

    target = load_target(name, (), (), "cpu")
    step = make_step(target.model, target.inputs, torch.optim.AdamW(target.model.parameters(), foreach=True))
    for _ in range(2):
        step()
    counts = {"call": 0, "c_call": 0}

    def profile(frame, event, arg) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return counts


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    from meshplan_research.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = {name: count(name) for name in ZOO}
    data = {"what": "Python function calls (call) and C calls from Python (c_call) in one training step, CPU",
            "made_by": "benchmarks/measure/python_calls.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(), "models": models}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
