"""The Hugging Face registry sweep of issue 51 (meshplan/specs/hf/sweep.py): every causal-LM model_type of the
installed transformers, from its default config.json, read by meshplan and compared with the parameter count of
the model transformers builds on the meta device. Prints one line per type and the tally (exact / refused /
wrong); "wrong" must be 0.

Run: python benchmarks/measure/hf_registry.py [model_type ...]
"""

from __future__ import annotations

import sys
import time

import transformers

from meshplan.specs.hf.sweep import registry_sweep, tally


def main(types: list[str]) -> None:
    transformers.logging.set_verbosity_error()
    start = time.perf_counter()
    outcomes = registry_sweep(types or None)
    for o in outcomes:
        print(f"{o.kind:8} {o.model_type:28} {o.detail}")
    counts = tally(outcomes)
    print(f"transformers {transformers.__version__}: {len(outcomes)} causal-LM types built from their default "
          f"configs: {counts['exact']} exact, {counts['refused']} refused, {counts['wrong']} wrong "
          f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
