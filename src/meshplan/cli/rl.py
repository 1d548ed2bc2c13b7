"""``meshplan rl``: the best way to run reinforcement-learning post-training of MODEL on GPUS accelerators: colocated,
split into rollout and training pools, or asynchronous, each side's layout searched (rl/search.py); with ``--emit``,
the best plan as verl's or OpenRLHF's launch arguments; with ``--report``, the HTML report's RL section. Heavy parts
are imported inside the command (start-up time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from meshplan.cli.common import apply, common_model, split_ints
from meshplan.errors import SpecError
from meshplan.ranges import check_options

_ALGORITHMS = ("grpo", "ppo", "dapo", "rloo", "reinforce++")  # rl/algorithms.RL_ALGORITHMS's names
_SETUPS = "colocated,split,async"
_OFFLOADS = "none,optimizer,all"
EMITS = ("verl", "openrlhf")


@click.command("rl")
@apply([common_model[0], common_model[1], common_model[3]])
@click.option("--gpus", type=int, required=True, help="GPU count of the job")
@click.option("--prompts", type=int, required=True, help="prompts per iteration (verl data.train_batch_size)")
@click.option("--samples-per-prompt", type=int, required=True, help="rollouts per prompt (verl rollout.n)")
@click.option("--input-len", type=int, required=True, help="prompt tokens")
@click.option("--output-len", type=int, required=True,
              help="response tokens: every response's, or with --mean-output the longest (max_response_length)")
@click.option("--mean-output", type=float, default=None, help="mean response tokens (a long-tailed distribution "
                                                                 "capped at --output-len; default: every response "
                                                                 "--output-len)")
@click.option("--lengths", default=None, help="fixed, uniform, lognormal (the default with --mean-output) or a CSV / "
                                              "JSONL file of output_len values")
@click.option("--length-spread", type=float, default=None, help="uniform range ratio or log-normal sigma")
@click.option("--algorithm", type=click.Choice(_ALGORITHMS), default="grpo", show_default=True)
@click.option("--mini-batches", type=int, default=1, show_default=True, help="optimizer steps per epoch")
@click.option("--epochs", type=int, default=1, show_default=True, help="passes over each batch (ppo_epochs)")
@click.option("--reward-model", default=None, help="a model-based reward (preset, file or config.json); default: a "
                                                   "rule (no GPU)")
@click.option("--critic/--no-critic", default=None, help="a value model (default: as the algorithm)")
@click.option("--reference/--no-reference", default=None, help="a reference's log-probs (default: as the algorithm)")
@click.option("--rollout-logprobs", is_flag=True, help="train on the engine's log-probs (no recompute pass)")
@click.option("--oversample", type=float, default=1.0, show_default=True,
              help="rollout batches per trained batch (DAPO's dynamic sampling)")
@click.option("--staleness", type=int, default=1, show_default=True,
              help="steps the split / async rollout runs ahead (0: the pools take turns)")
@click.option("--setup", "setups", default=_SETUPS, show_default=True, help="set-ups to search")
@click.option("--rollout-gpus", default=None, help="rollout pool sizes to try (split, async)")
@click.option("--offload", "offloads", default=_OFFLOADS, show_default=True,
              help="colocated trainer state held on the host during the rollout")
@click.option("--sync", default="", help="the weight transfer: local, broadcast, reshard or storage (default: the "
                                         "set-up's own: local colocated, broadcast between pools)")
@click.option("--storage-bandwidth", default="40 GB/s", show_default=True,
              help="per node, for --sync storage (the DGX SuperPOD storage fabric's read rate)")
@click.option("--framework", default=None, help="trainer's stack preset (default megatron-core; with --emit openrlhf, "
                                                "deepspeed)")
@click.option("--engine", "engine_ref", default="vllm", show_default=True, help="rollout engine preset")
@click.option("--top", "top_k", type=int, default=10, show_default=True, help="plans to list")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--report", "report_path", default=None, help="also write an HTML report of the plans to this file")
@click.option("--emit", "emit_format", type=click.Choice(EMITS), default=None,
              help="write the best plan as this framework's launch arguments")
@click.option("--emit-to", default=None, help="with --emit: the file to write them to")
def rl_cmd(model_ref: str, system_ref: str, gpus: int, as_json: bool, **options: Any) -> None:
    """Plan RL post-training (rollout, reference, reward, trainer, weight sync) of MODEL on GPUS accelerators of
    SYSTEM: colocated, split and asynchronous set-ups, each side's layout searched."""
    from meshplan.rl.search import RLSpace, rl_search

    check_options(gpus=gpus, top=options["top_k"], input_len=options["input_len"], output_len=options["output_len"])
    emit_format, emit_to, report_path = options.pop("emit_format"), options.pop("emit_to"), options.pop("report_path")
    _outputs(emit_format, emit_to, report_path, as_json)
    model, system = _inputs(model_ref, system_ref, options.pop("nvlink_domain"), gpus)
    job = make_job(options, model)
    space = RLSpace(setups=_words(options["setups"], "setup"), offloads=_words(options["offloads"], "offload"),
                    rollout_gpus=tuple(split_ints(options["rollout_gpus"], "rollout-gpus") or ()),
                    stack=_stack(options["framework"], emit_format), engine=_engine(options["engine_ref"]),
                    sync=options["sync"], storage_bandwidth=_rate(options["storage_bandwidth"]))
    result = rl_search(model, system, gpus, job, space, top_k=options["top_k"])
    from meshplan.report.rl_text import print_rl

    print_rl(result, as_json=as_json)
    if report_path:
        from meshplan.report.rl_html import write_rl

        write_rl(report_path, result)
        if not as_json:
            click.echo(f"wrote {report_path}")
    if emit_format:
        from meshplan.rl.launch import write_rl_launch

        write_rl_launch(result, emit_format, emit_to, model_ref)


def make_job(options: dict[str, Any], model) -> Any:
    """The RLJob of the command line's options."""
    from meshplan.rl.job import RLJob
    from meshplan.specs.model_load import load_model

    mean, lengths = options["mean_output"], options["lengths"]
    kind, path = lengths or ("lognormal" if mean else "fixed"), ""
    if kind not in ("fixed", "uniform", "lognormal"):
        if Path(kind).suffix.lower() not in (".csv", ".jsonl", ".json"):
            raise SpecError(f"lengths={kind!r} must be fixed, uniform, lognormal or a .csv / .jsonl file of output_len")
        kind, path = "empirical", lengths
    reward = load_model(options["reward_model"]) if options["reward_model"] else None
    check_options(prompts=options["prompts"], samples_per_prompt=options["samples_per_prompt"])
    served = max(model.seq_length, model.max_position_embeddings)
    if options["input_len"] + options["output_len"] > served:
        raise SpecError(f"input-len + output-len = {options['input_len'] + options['output_len']:,} tokens exceed "
                        f"{model.name}'s context of {served:,}")
    return RLJob(prompts=options["prompts"], samples_per_prompt=options["samples_per_prompt"],
                 input_len=options["input_len"], output_len=options["output_len"], lengths=kind,
                 mean_output=float(mean or 0.0), length_spread=float(options["length_spread"] or 0.0),
                 lengths_file=path,
                 algorithm=options["algorithm"], mini_batches=options["mini_batches"], epochs=options["epochs"],
                 reference=options["reference"], critic=options["critic"], reward_model=reward,
                 rollout_logprobs=options["rollout_logprobs"], oversample=options["oversample"],
                 staleness=options["staleness"])


def _inputs(model_ref: str, system_ref: str, nvlink_domain: int | None, gpus: int):
    from dataclasses import replace

    from meshplan.specs.hardware import load_system
    from meshplan.specs.model_load import load_model

    model, system = load_model(model_ref), load_system(system_ref)
    if nvlink_domain is not None:
        system = replace(system, network=replace(system.network, nvlink_domain=nvlink_domain))
    system.cluster(gpus)  # a GPU count the mesh cannot hold is one line here
    return model, system


def _rate(text: str) -> float:
    """``--storage-bandwidth``: bytes/s with its unit, in RANGES["storage_bandwidth"]."""
    from meshplan.ranges import RANGES
    from meshplan.units import parse_quantity

    value = parse_quantity(text, "storage-bandwidth", "B/s")
    r = RANGES["storage_bandwidth"]
    if not r.low <= value <= r.high:
        raise SpecError(f"storage-bandwidth={text} is outside {r.low:g} … {r.high:g} B/s")
    return value


def _words(text: str, field: str) -> tuple[str, ...]:
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    if not words:
        raise SpecError(f"{field}={text!r}: give at least one")
    return words


def _stack(name: str | None, emit_format: str | None):
    """``--framework``, by default the one the launch format's framework runs."""
    from meshplan.specs.stack import DEFAULT_FRAMEWORK, load_stack

    if name is None and emit_format:
        from meshplan.rl.launch import RL_LAUNCH_FORMATS

        name = RL_LAUNCH_FORMATS[emit_format].framework
    return load_stack(name or DEFAULT_FRAMEWORK)


def _engine(name: str):
    from meshplan.serve.engine import load_engine

    return load_engine(name)


def _outputs(emit_format: str | None, emit_to: str | None, report_path: str | None, as_json: bool) -> None:
    """The files asked for can be written, before the search."""
    from meshplan.cli.emit import check_emit
    from meshplan.files import writable

    check_emit(emit_format, emit_to, as_json)
    if report_path:
        from meshplan.report.vega import require_report_extra

        writable(report_path, "report")
        require_report_extra()
