"""``meshplan check-step``: predict a training step on this machine, run it, compare (meshplan.measure)."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import click

from meshplan.cli.common import working
from meshplan.errors import MissingDependency, SpecError


@click.command("check-step")
@click.argument("model_ref", metavar="MODEL")
@click.option("--input-shape", "shapes", multiple=True, help="inputs when the factory returns the module alone")
@click.option("--dtype", "dtypes", multiple=True, help="input dtype, one or one per input (default int64)")
@click.option("--optimizer", type=click.Choice(["adamw", "adam", "sgd-momentum", "sgd"]), default="adamw",
              show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--threads", type=int, default=1, show_default=True, help="intra-op threads of the step and of its "
              "calibration (1: robust on a shared host)")
@click.option("--clock", type=click.Choice(["auto", "cpu", "wall"]), default="auto", show_default=True,
              help="auto: this process's CPU time for one thread on a CPU, else the wall clock")
@click.option("--steps", type=int, default=7, show_default=True,
              help="timed steps per round (the median counts: 3 at least, so that one slow step cannot be it)")
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--rounds", type=int, default=2, show_default=True,
              help="interleaved calibrate / measure rounds (2 at least: one round cannot tell a loaded machine's "
                   "drift from the model's error; issue 48 read +77.6 %% with one)")
@click.option("--allocator", type=click.Choice(["keep", "system"]), default="keep", show_default=True,
              help="keep: glibc reuses freed memory (no page faults each step); system: glibc's defaults")
@click.option("--world-size", type=int, default=1, show_default=True, help="data-parallel ranks on this host "
              "(gloo on CPU, NCCL on GPUs)")
@click.option("--learned", is_flag=True, help="add the learned residual (trained on --profiles) to the prediction")
@click.option("--profiles", default="data/measured", show_default=True, help="per-op profiles for --learned")
@click.option("--save-profile", default=None, help="append this run's per-op profile to a .jsonl file")
@click.option("--top", type=int, default=10, show_default=True, help="discrepancies to list")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def check_step_cmd(model_ref: str, **options: object) -> None:
    """Predict one training step of MODEL (MODULE:FACTORY; or, with the research package meshplan_research, a zoo
    name: gpt2 llama mistral qwen-moe bert t5 vit resnet50 convnext mlp-mixer) on this machine, run it for real and
    compare: step time, peak memory, per op class and the largest discrepancies."""
    main(model_ref, options)




# the least that makes check-step's comparison robust (issue 48: --rounds 1 read +77.6 % on a loaded machine): two
# interleaved rounds (a drift between calibrating and measuring shows as their spread), three timed steps a round
# (the median is then no single step's)
ROBUST = {"rounds": 2, "steps": 3}


def main(ref: str, options: dict[str, Any]) -> None:
    """The command line's check-step: check the options, run, print tables or JSON."""
    _check_counts(options)  # bad numbers are refused at once, before torch is imported (seconds to a minute)
    if importlib.util.find_spec("torch") is None:  # before any module that imports it
        raise MissingDependency("torch", "torch")
    from meshplan.measure.check import CheckSettings
    from meshplan.measure.timing import check_threads

    apply_learned, device = _before_measuring(ref, options)
    settings = CheckSettings(device=device, threads=check_threads(options["threads"]), clock=options["clock"],
                             warmup=options["warmup"], steps=options["steps"], rounds=options["rounds"],
                             allocator=options["allocator"], optimizer=options["optimizer"])
    if options["world_size"] > 1:
        from meshplan.measure.dp import check_data_parallel, render_dp

        with working(f"check-step: {options['world_size']} ranks measuring {ref}", quiet=options["as_json"],
                     animate=False):  # the ranks are forked
            result = check_data_parallel(ref, options["world_size"], settings, options["shapes"], options["dtypes"])
        if options["as_json"]:
            click.echo(json.dumps(result.to_dict(), indent=2))
        else:
            from meshplan.report.console import terminal_console

            render_dp(result, terminal_console())
        return
    from meshplan.measure.command import check_step_ref

    with working(f"check-step: predicting and measuring {ref}", quiet=options["as_json"]):
        result = check_step_ref(ref, shapes=options["shapes"], dtypes=options["dtypes"],
                                optimizer=options["optimizer"], settings=settings)
    from meshplan.measure import compare

    learned = None if apply_learned is None else apply_learned(result, options["profiles"])
    if options["save_profile"]:
        from meshplan.measure.records import append_profile

        append_profile(options["save_profile"], result)
    data = compare.check_dict(result, options["top"])
    if learned is not None:
        data["learned"] = learned
    if options["as_json"]:
        click.echo(json.dumps(data, indent=2))
        return
    from meshplan.report.console import terminal_console

    compare.render_check(result, terminal_console(), options["top"], learned)


def _check_counts(options: dict[str, Any]) -> None:
    """The numbers alone (no import of torch or of the measuring modules): counts, rounds and steps, warm-up steps,
    threads, and the world size against calibrate's MAX_LOCAL_RANKS (this host's cores or GPUs: _check_ranks)."""
    from meshplan.calibrate.settings import MAX_LOCAL_RANKS

    for name in ("top", "world_size"):
        if options[name] < 1:
            raise SpecError(f"{name.replace('_', '-')}={options[name]} must be a positive integer")
    for name, low in ROBUST.items():  # settings whose comparison one noisy sample would decide
        if not low <= options[name] <= 1000:
            raise SpecError(f"{name}={options[name]} must be an integer from {low} to 1000 (fewer cannot tell a loaded "
                            "machine's noise from the model's error)")
    if not 0 <= options["warmup"] <= 1000:
        raise SpecError(f"warmup={options['warmup']} must be an integer from 0 to 1000")
    if options["world_size"] > MAX_LOCAL_RANKS:
        raise SpecError(f"world-size={options['world_size']} is more than the {MAX_LOCAL_RANKS} local ranks one host "
                        "runs (one process a rank on this host's cores or GPUs)")
    if not 1 <= options["threads"] <= 1024:
        raise SpecError(f"threads={options['threads']} must be an integer from 1 to 1024")


def _before_measuring(ref: str, options: dict[str, Any]) -> tuple[Any, str]:
    """Every refusal before a step is timed or a rank forked, after the counts (_check_counts): the profile to save,
    the profiles of --learned, the device and the world size (with the factory found first)."""
    if options["save_profile"]:
        from meshplan.files import writable

        writable(options["save_profile"], "save-profile")
    apply_learned = None
    if options["learned"]:  # refused before measuring: without the research package, or without profiles
        from meshplan.measure.plugins import learned_residual

        options["profiles"] = _profiles(options["profiles"])
        apply_learned = learned_residual()
    from meshplan.calibrate.bench import resolve_device

    device = resolve_device(options["device"])
    _check_ranks(options["world_size"], device)
    if options["world_size"] > 1:  # the factory is found before any rank is forked
        from meshplan.trace.command import load_factory

        if ":" in ref:
            load_factory(ref)
    return apply_learned, device


def _profiles(given: str) -> str:
    """--profiles as given, or (the default, run outside the checkout) the checkout's data/measured beside the
    installed sources; refused before measuring when neither exists or it holds no profile (/dev/null, an empty
    file, a FIFO)."""
    import os.path
    from pathlib import Path

    import meshplan
    from meshplan.files import check_input
    from meshplan.measure.records import read_profiles

    beside = str(Path(meshplan.__file__).resolve().parents[2] / given)
    found = next((p for p in (given, beside) if os.path.exists(p)), None)  # os.path: False for a name too long
    if found is None:
        raise SpecError(f"profiles={given!r} does not exist: --learned needs the zoo's profiles (a .jsonl file or a "
                        "folder of them; python benchmarks/docs/measured.py writes data/measured/ in a checkout)")
    if not os.path.isdir(found):
        check_input(found, "profiles")
    if not read_profiles(found):
        raise SpecError(f"profiles={given!r} holds no profile record: --learned needs the zoo's profiles")
    return found


def _check_ranks(world: int, device: str) -> None:
    """--world-size before any rank is forked: at most the GPUs of this host on CUDA, its cores on a CPU (each rank
    is a process timing its own step: more ranks than cores time each other's waits), and never more than
    calibrate's MAX_LOCAL_RANKS (calibrate/settings.py: the local ranks one host runs)."""
    import os

    from meshplan.calibrate.settings import MAX_LOCAL_RANKS

    if world <= 1:
        return
    if device.startswith("cuda"):
        import torch

        have, what = torch.cuda.device_count(), "GPUs"
    else:
        have, what = os.cpu_count() or 1, "CPU cores"
    limit = min(have, MAX_LOCAL_RANKS)
    if world > limit:
        raise SpecError(f"world-size={world} is more than the {limit} ranks this host runs ({have} {what}; at most "
                        f"{MAX_LOCAL_RANKS} local ranks)")
