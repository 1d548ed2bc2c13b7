"""The host-bound regime on this machine (issue 46, item 3): the host's cost per eager PyTorch call measured as
``meshplan calibrate`` measures it (calibrate/dispatch.py, fitted t = t0 + work / rate), then check-step on models
of many small ops, Linear + LayerNorm + ReLU + residual add per layer at batch 1, from widths where the host's
dispatch is the step to widths where the work is: the measured step against the prediction with the host's costs
(work + launches × host_dispatch + autograd, engine and module calls) and by work alone (measure/hostbound.py).
Then the same model (width 16) data-parallel over 2 gloo processes (check-step --world-size 2, measure/dp.py): its
32 gradient all-reduces of a few hundred bytes each are priced by the fitted α per call, the small-message regime
of the collectives. Writes data/measured/<date>-<machine>-host-dispatch.json.

    python benchmarks/measure/host_dispatch.py                  # about a minute on a quiet 2-core host
    python benchmarks/measure/host_dispatch.py --widths 16,64 --out /tmp/hd.json

One thread and the process's CPU time, as check-step (measure/timing.py); run it when the machine is quiet: the
load average before and after is in the file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))

from measured import machine_slug  # noqa: E402
from meshplan.calibrate.dispatch import bench_dispatch  # noqa: E402
from meshplan.calibrate.fit import fit_dispatch, host_dispatch  # noqa: E402
from meshplan.calibrate.settings import settings_for  # noqa: E402
from meshplan.measure.check import CheckSettings, check_step, machine  # noqa: E402
from meshplan.measure.command import optimizer_factory  # noqa: E402
from meshplan.measure.hostbound import host_bound  # noqa: E402
from meshplan.measure.timing import load_average, pinned_threads  # noqa: E402

LAYERS = 8


def many_small_ops(width: int = 16, layers: int = LAYERS):
    """``layers`` × (Linear(width, width), LayerNorm, ReLU, residual add), a sum for the loss; input 1 × width."""
    import torch

    class ManySmallOps(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.LayerNorm(width)) for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = x + torch.relu(layer(x))
            return x.sum()

    torch.manual_seed(0)
    return ManySmallOps(), (torch.randn(1, width),)


def check_row(width: int, dispatch: float) -> dict:
    model, inputs = many_small_ops(width)
    result = check_step(f"many-small-ops-{width}", model, inputs,
                        optimizer_factory("adamw", list(model.parameters())),
                        CheckSettings(rounds=2, steps=7, warmup=3, profile_ops=False))
    split, measured = host_bound(result.prediction, dispatch), result.measurement.timing.seconds
    return {"width": width, "layers": LAYERS, "batch": 1, "measured_s": measured,
            "predicted_s": result.prediction.seconds, **split.to_dict(),
            "error_with_host": split.with_host / measured - 1, "error_without_host": split.without_host / measured - 1}


def gloo_row(world: int) -> dict:
    """check-step --world-size ``world`` of many_small_ops (width 16): the step, and the all-reduces against the
    fitted α alone (gradients × latency, no bandwidth term)."""
    from meshplan.measure.dp import check_data_parallel

    result = check_data_parallel("host_dispatch:many_small_ops", world,
                                 CheckSettings(rounds=2, steps=7, warmup=3, profile_ops=False))
    data = result.to_dict()
    alpha = result.gradients * result.link.latency
    return {"world_size": world, "backend": result.backend, "step": data["step"], "compute": data["compute"],
            "all_reduce": data["all_reduce"] | {"alpha_only_s": alpha}, "link": data["link"], "load": result.load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="16,64,256,1024", help="model widths, comma-separated")
    parser.add_argument("--world-size", type=int, default=2, help="gloo ranks of the data-parallel row (1: none)")
    parser.add_argument("--out", default=None, help="output .json (default: data/measured/<date>-<machine>-...)")
    args = parser.parse_args()
    load_before = load_average()
    with pinned_threads(1):
        samples = bench_dispatch(settings_for("cpu", quick=False), "cpu")
    fits = fit_dispatch(samples)
    found = host_dispatch(fits)
    rows = [check_row(int(w), found.seconds) for w in args.widths.split(",")]
    gloo = gloo_row(args.world_size) if args.world_size > 1 else None
    mach = machine("cpu", 1)
    data = {"date": datetime.date.today().isoformat(), "machine": mach, "load": {"before": load_before,
            "after": load_average()}, "host_dispatch_s": found.seconds, "module_call_s": found.module,
            "dispatch_fits": [asdict(f) for f in fits], "dispatch_samples": [asdict(s) for s in samples],
            "check_step": rows, "data_parallel": gloo}
    out = Path(args.out) if args.out else ROOT / "data" / "measured" / (
        f"{data['date']}-{machine_slug(mach['name'], os.cpu_count() or 1)}-host-dispatch.json")
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{mach['name']}, torch {mach['torch']}: host_dispatch {found.seconds * 1e6:.3g} us per call "
          f"(" + ", ".join(f"{f.op} {f.overhead * 1e6:.3g}" for f in fits) + " us), module call +"
          f"{found.module * 1e6:.3g} us")
    print(f"{'width':>6} {'launches':>8} {'measured':>10} {'with host':>10} {'err':>7} {'work alone':>10} {'err':>7} "
          f"{'host share':>10}")
    for r in rows:
        print(f"{r['width']:>6} {r['launches']:>8} {r['measured_s'] * 1e3:>8.3f}ms {r['with_host_s'] * 1e3:>8.3f}ms "
              f"{r['error_with_host']:>+7.1%} {r['without_host_s'] * 1e3:>8.3f}ms {r['error_without_host']:>+7.1%} "
              f"{r['host_share']:>10.1%}")
    if gloo is not None:
        ar, step = gloo["all_reduce"], gloo["step"]
        print(f"width 16 over {gloo['world_size']} {gloo['backend']} ranks: step {step['measured_s'] * 1e3:.3f} ms "
              f"measured, {step['predicted_s'] * 1e3:.3f} ms predicted ({step['error']:+.1%}); "
              f"{ar['gradients']} all-reduces of {ar['bytes']:,} B in all: {ar['measured_s'] * 1e3:.3f} ms measured, "
              f"{ar['alpha_only_s'] * 1e3:.3f} ms by α alone ({gloo['link']['latency'] * 1e6:.0f} us per call)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
