"""How the fitted constants' leave-one-source-out refits move under the fits' loss (issue 79; meshplan_validation/
robust_loss.py): the capped L1 min(|r|, cap) (``knee`` 0: the serving fit's, and the training fit's until 2026-11-30,
CAPPED_TRAINING) against the same with its kinks rounded (robust_loss.TRAINING, shipped, and ROUNDED_SERVING), on the
linearised fits that
benchmarks/docs/out_of_source.py refits (refit.Linear).

Printed, per fit (training: ``gemm``, ``attention``; serving: ``kv_read``, ``experts`` and the two engines' host time
per iteration):
- the robust scale of the fit's log-errors at the shipped constants (1.4826 · MAD) and Huber's knee 1.345 σ from it;
- each constant refitted on all sources and without each source (the values out_of_source.py prices a left-out
  source's runs with), under each loss, and their spread (max - min over the left-out sources);
- stability: each constant's largest move when one source's measured values all shift by ±1 % (a refit that jumps by
  more than the shift's own pull, 1 % spread over the constant's sensitivity, is the capped L1's step from one run's
  zero residual to another's).

- what bw19's Blackwell attention share (data/measured/2026-11-30-blackwell-cudnn-attention.md: cuDNN 9.10-9.16's
  fused attention at 0.847 forward, 0.899 backward of 9.17's rate on a Blackwell GPU, never priced) would do to the
  training refits: to first order (what the linearised refit sees) the fit half's dense Megatron-Bridge 25.09 / 25.11
  Blackwell runs with the fused kernel move by their attention sensitivity times log(share), share the two passes'
  geometric mean weighted by their FLOPs (backward 2.5 x forward's: Dao 2023, FlashAttention-2, its benchmarks'
  count; five matmuls with the recomputed scores against two); each refit before -> after, under each loss.

With ``--bands L1_FILE ROUNDED_FILE DIR``: the share's effect out of source, each loss: L1_FILE and ROUNDED_FILE are
out_of_source.json as written with each loss (benchmarks/docs/out_of_source.py --out, robust_loss.TRAINING at knee 0
for the L1 file), their held-out training runs of every refitted source re-priced at
the refits with the share (``repriced``), into DIR for error_bands.py --coverage --from.

Run: PYTHONPATH=src:. python benchmarks/measure/robust_refits.py [--bands L1_FILE ROUNDED_FILE DIR]  (about a minute:
the two linearisations; --bands another)
Results: data/measured/2026-11-30-robust-loss.md
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshplan.specs.efficiency import DEFAULT
from meshplan_validation import loso_serving, loso_training
from meshplan_validation.case import Case
from meshplan_validation.records import read_runs
from meshplan_validation.refit import Linear
from meshplan_validation.robust_loss import CAPPED_TRAINING, ROUNDED_SERVING, SERVING, TRAINING, Loss

ROOT = Path(__file__).resolve().parents[2]
TRAINING_FILES = {"published": "data/validation/published_runs.jsonl", "small_work": "data/validation/small_work.jsonl",
                  "vtrain": "data/validation/vtrain_single_node_dev.jsonl",
                  "independent": "benchmarks/data/independent_runs.jsonl"}  # out_of_source.py's TRAINING
ROUNDED = {TRAINING: TRAINING, SERVING: ROUNDED_SERVING}  # each shipped loss's rounded twin (training ships it)
CAPPED = {TRAINING: CAPPED_TRAINING, SERVING: SERVING}  # and its capped L1
SHIFT = 0.01  # one source's measured values moved by ±1 %
FORWARD, BACKWARD = 0.847, 0.899  # cuDNN 9.13.1 / 9.17.0 on one GB300 (the bw19 record)
BACKWARD_FLOPS = 2.5  # the backward pass's FLOPs over the forward's (FlashAttention-2: five matmuls against two)
BRIDGE_RELEASES = re.compile(r"mbridge_25\.(09|11)_.*DGX-(B200|GB200|GB300)")  # containers with cuDNN 9.11 / 9.13.1


def scale(linear: Linear) -> float:
    """1.4826 · the median absolute deviation of the fit's log-errors at the shipped constants."""
    r = linear.base - linear.measured
    return float(1.4826 * np.median(np.abs(r - np.median(r))))


def refits(linear: Linear) -> dict[str, dict[str, float]]:
    sources = sorted(set(linear.sources.tolist()))
    return {"all sources": linear.refit(None)} | {s: linear.refit(s) for s in sources}


def stability(linear: Linear) -> dict[str, float]:
    """Each constant's largest relative move of the all-sources refit when one source's runs shift by ±``SHIFT``."""
    base = linear.refit(None)
    worst = dict.fromkeys(base, 0.0)
    for s in sorted(set(linear.sources.tolist())):
        for sign in (1, -1):
            moved = replace(linear, measured=linear.measured + sign * SHIFT * (linear.sources == s))
            for k, v in moved.refit(None).items():
                worst[k] = max(worst[k], abs(v / base[k] - 1) if base[k] else abs(v))
    return worst


def show(title: str, linear: Linear) -> None:
    sigma = scale(linear)
    print(f"\n== {title}: {len(linear.base)} observations, {linear.loss}; 1.4826 MAD = {sigma:.3f}, "
          f"1.345 sigma = {1.345 * sigma:.3f}")
    losses = {"capped L1": CAPPED[linear.loss], "rounded": ROUNDED[linear.loss]}
    found = {name: refits(replace(linear, loss=loss)) for name, loss in losses.items()}
    names = [c.name for c in linear.coords]
    print(f"{'left out':<22}" + "".join(f"{n + ' ' + k:>22}" for n in names for k in ("L1", "rounded")))
    for source in found["capped L1"]:
        print(f"{source:<22}" + "".join(f"{found[k][source][n]:>22.5g}" for n in names for k in losses))
    print(f"{'spread (max - min)':<22}" + "".join(
        f"{np.ptp([v[n] for s, v in found[k].items() if s != 'all sources']):>22.4g}" for n in names for k in losses))
    for name, loss in losses.items():
        worst = stability(replace(linear, loss=loss))
        print(f"±1 % of one source, {name}: " + ", ".join(f"{n} {100 * w:.2f} %" for n, w in worst.items()))


def blackwell_share(cases: list[Case], linear: Linear) -> Linear:
    """bw19's release share on the linearised training fit, first order (module docstring): the fit priced with it."""
    share = math.exp((math.log(FORWARD) + BACKWARD_FLOPS * math.log(BACKWARD)) / (1 + BACKWARD_FLOPS))
    hit = np.array([bool(BRIDGE_RELEASES.match(c.id)) and c.stack.attention_kernel == "fused" for c in cases])
    print(f"\n== bw19's Blackwell attention share {share:.4f} on {int(hit.sum())} fit runs "
          f"(attention sensitivity {np.min(linear.jacobian[hit, 1]):.2f}-{np.max(linear.jacobian[hit, 1]):.2f})")
    priced = replace(linear, base=linear.base + hit * linear.jacobian[:, 1] * math.log(share))
    for name, loss in (("capped L1", CAPPED[linear.loss]), ("rounded", ROUNDED[linear.loss])):
        before, after = refits(replace(linear, loss=loss)), refits(replace(priced, loss=loss))
        print(f"{name}: " + "; ".join(f"{s} " + ", ".join(
            f"{k} {before[s][k]:.4f} -> {after[s][k]:.4f}" for k in before[s]) for s in before))
    return priced


def repriced(priced: Linear, loss: Loss, source_file: Path, out: Path) -> None:
    """``source_file`` (an out_of_source.json whose refits minimised ``loss``) with every held-out training run of a
    source whose refit moves re-priced exactly at the refits of ``priced`` (Megatron-Bridge's own runs, whose price
    the share itself would move, left as they are), written to ``out``."""
    data = json.loads(source_file.read_text())
    runs = {(name, r.record["id"]): r for name, path in TRAINING_FILES.items()
            for r in loso_training.runs_of(read_runs(ROOT / path), name)}
    refit, values = loso_training.EfficiencyRefit(replace(priced, loss=loss)), {}
    shipped = {c.name: getattr(DEFAULT, c.name) for c in loso_training.DENSE}
    for row in data["runs"]:
        if row["kind"] != "training" or row.get("oos_error") is None or row["source"] == "megatron_bridge":
            continue
        source = row["source"]
        values.setdefault(source, refit.without(source))
        case = runs[row["file"], row["id"]].case
        if values[source] != shipped and case is not None:
            _, error, _, skip = loso_training.error_of(loso_training.without_source(case, source),
                                                       DEFAULT.with_(**values[source]))
            row["oos_error"] = row["oos_error"] if skip or error is None else error
    out.write_text(json.dumps(data))
    print(f"wrote {out}: then error_bands.py --coverage --from {out}")


def main() -> None:
    runs = loso_training.runs_of(read_runs(ROOT / "data/validation/published_runs.jsonl"), "published")
    cases = [c for c in loso_training.fit_cases(runs) if not c.model.is_moe]  # EfficiencyRefit.build's
    linear = loso_training.linearised(cases, loso_training.DENSE)
    show("training (fit_efficiency.py)", linear)
    priced = blackwell_share(cases, linear)
    if "--bands" in sys.argv:  # --bands L1_FILE ROUNDED_FILE DIR: the share's out-of-source effect, each loss
        i = sys.argv.index("--bands")
        l1, rounded, folder = (Path(a) for a in sys.argv[i + 1:i + 4])
        repriced(priced, linear.loss, l1, folder / "share_capped_l1.json")
        repriced(priced, ROUNDED[linear.loss], rounded, folder / "share_rounded.json")
    records = [json.loads(line) for line in (ROOT / "data/serving/published_serving.jsonl").read_text().splitlines()
               if line.strip()]
    show("serving (fit_inference.py)", loso_serving.linearised([r for r in records if r.get("split") == "fit"]))


if __name__ == "__main__":
    main()
