"""What Megatron-LM refuses of an argument list that meshplan reads (``estimate --from``), so that the reader refuses
it too instead of pricing a run that would not start: each rule is one assertion of Megatron-LM's
``validate_args`` (megatron/training/arguments.py at tag core_v0.17.0, the file PyPI's megatron-core 0.17.0 wheel
ships; the line numbers are that file's, and tests/test_configs_megatron_lm.py runs the real ``validate_args`` on
each rule's example to see it refuse), or an argument its argparse does not know that meshplan once wrote.

A rule reads the parsed options (``--name`` -> value, or True for a flag) and the sizes already read.

Also the data-parallel overlaps, stated once (``DP_OVERLAPS``: the Megatron-Bridge configs, configs/nemo.py, name
them as fields, Megatron-LM as flags), and how Megatron-LM reads its flags (``dp_overlaps``): the one reading of them
that the config reader (configs/megatron.py) and the validation layer (a published record's stated arguments) share.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from meshplan.errors import SpecError

ARGUMENTS = "megatron/training/arguments.py"


@dataclass(frozen=True)
class ArgumentRule:
    """One refusal of Megatron-LM's: ``test`` (options, sizes) -> True where it refuses, ``what`` it says, and the
    ``lines`` of arguments.py (core_v0.17.0) that say it, beginning with the ``quote``."""

    name: str
    test: Callable[[dict[str, Any], dict[str, int]], bool]
    what: str
    lines: tuple[int, int]
    quote: str

    @property
    def source(self) -> str:
        return f"Megatron-LM core_v0.17.0 {ARGUMENTS}:{self.lines[0]}-{self.lines[1]}"


# Megatron-core's data-parallel overlaps, Stack field -> DistributedDataParallelConfig field (megatron/core/distributed/
# distributed_data_parallel_config.py), the one statement of them: Megatron-Bridge's configs name the field itself
# (ddp.* and its CommOverlapConfig's comm_overlap.*: configs/nemo.py), Megatron-LM's arguments the field with dashes
# (``DP_OVERLAP_FLAGS``; training.py get_model fills each DistributedDataParallelConfig field from the argument of its
# name). Both arguments are store_true, off unless the argument list gives them (arguments.py:2662-2663 and 2683-2684
# @ core_v0.17.0; megatron/arguments.py:1125-1131 @ 6aad2116, the February 2024 tree its CI golden values come from).
# Without --overlap-param-gather the distributed optimizer all-gathers the updated weights synchronously in its step,
# before the next forward starts (megatron/core/optimizer/distrib_optimizer.py step_with_ready_grads @ core_v0.15.0;
# megatron/optimizer/distrib_optimizer.py:1231-1241 @ 6aad2116)
DP_OVERLAPS = (("overlap_dp", "overlap_grad_reduce"), ("overlap_param_gather", "overlap_param_gather"))
DP_OVERLAP_FLAGS = tuple((field, "--" + key.replace("_", "-")) for field, key in DP_OVERLAPS)


def dp_overlaps(given: Collection[str]) -> dict[str, bool]:
    """Stack.overlap_dp and Stack.overlap_param_gather as Megatron-LM reads the arguments ``given`` (names such as
    ``--overlap-grad-reduce``): each on exactly where its flag is given."""
    return {field: flag in given for field, flag in DP_OVERLAP_FLAGS}


def _number(options: dict[str, Any], name: str, default: int) -> int:
    try:
        return int(options.get(name, default))
    except (TypeError, ValueError):
        return default  # the reader refuses it with its own line


ARGUMENT_RULES: tuple[ArgumentRule, ...] = (
    ArgumentRule("no_virtual_pipeline_argument",
                 lambda o, s: "--virtual-pipeline-model-parallel-size" in o,
                 "--virtual-pipeline-model-parallel-size is not an argument of pretrain_gpt.py (argparse stops at it: "
                 "'unrecognized arguments'); the interleaved schedule's virtual stages are "
                 "--num-virtual-stages-per-pipeline-rank N (or --num-layers-per-virtual-pipeline-stage)",
                 (2655, 2658), "'--num-layers-per-virtual-pipeline-stage'"),
    ArgumentRule("one_virtual_pipeline_argument",
                 lambda o, s: "--num-virtual-stages-per-pipeline-rank" in o
                 and "--num-layers-per-virtual-pipeline-stage" in o,
                 "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank together",
                 (759, 766), "No more than one of the following arguments can be set at the same time"),
    ArgumentRule("uneven_stages_by_layers",
                 lambda o, s: "--num-layers-per-virtual-pipeline-stage" in o
                 and ("--decoder-first-pipeline-num-layers" in o or "--decoder-last-pipeline-num-layers" in o),
                 "--num-layers-per-virtual-pipeline-stage with an uneven first or last stage (use "
                 "--num-virtual-stages-per-pipeline-rank)", (786, 788),
                 "please use --num-virtual-stages-per-pipeline-rank"),
    ArgumentRule("offload_needs_precision_aware",
                 lambda o, s: "--optimizer-cpu-offload" in o and "--use-precision-aware-optimizer" not in o,
                 "--optimizer-cpu-offload without --use-precision-aware-optimizer", (1488, 1492),
                 "The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`"),
    ArgumentRule("selective_without_method",
                 lambda o, s: o.get("--recompute-granularity") == "selective" and "--recompute-method" in o,
                 "--recompute-method with --recompute-granularity selective", (1185, 1188),
                 "recompute method is not yet supported for"),
    ArgumentRule("layers_divisible_by_pp",
                 lambda o, s: not _virtual(o) and "--decoder-first-pipeline-num-layers" not in o
                 and "--decoder-last-pipeline-num-layers" not in o and s["pp"] > 0
                 and _number(o, "--num-layers", 0) % s["pp"] != 0,
                 "--num-layers not a multiple of --pipeline-model-parallel-size without "
                 "--decoder-first-pipeline-num-layers or --decoder-last-pipeline-num-layers", (817, 830),
                 "if args.decoder_first_pipeline_num_layers is None and args.decoder_last_pipeline_num_layers is None"),
    ArgumentRule("seq_divisible_by_2cp",
                 lambda o, s: s["cp"] > 1 and _number(o, "--seq-length", 0) % (2 * s["cp"]) != 0,
                 "--seq-length not a multiple of 2 x --context-parallel-size", (1103, 1106),
                 "seq-length should be a multiple of 2 * context-parallel-size"),
    ArgumentRule("interleaved_needs_pp",
                 lambda o, s: _virtual(o) and s["pp"] <= (1 if "--no-overlap-p2p-communication" not in o else 2),
                 "virtual pipeline stages with --pipeline-model-parallel-size 1 (or 2 without p2p overlap)",
                 (832, 841), "When interleaved schedule is used"),
    ArgumentRule("tp_overlap_needs_sp",
                 lambda o, s: "--tp-comm-overlap" in o and (s["tp"] == 1 or "--sequence-parallel" not in o),
                 "--tp-comm-overlap without --sequence-parallel (or at tp = 1, where validate_args turns sequence "
                 "parallelism off)", (1201, 1202), "assert args.sequence_parallel == True"),
    ArgumentRule("param_gather_needs_grad_reduce",
                 lambda o, s: "--overlap-param-gather" in o and not ("--overlap-grad-reduce" in o
                                                                     and "--use-distributed-optimizer" in o),
                 "--overlap-param-gather without --overlap-grad-reduce and --use-distributed-optimizer",
                 (856, 860), "assert args.use_distributed_optimizer or args.use_megatron_fsdp"),
)


def _virtual(options: dict[str, Any]) -> bool:
    return _number(options, "--num-virtual-stages-per-pipeline-rank", 1) > 1 or \
        "--num-layers-per-virtual-pipeline-stage" in options


def check_rules(options: dict[str, Any], sizes: dict[str, int]) -> None:
    """The first rule that refuses ``options`` (with ``sizes``: tp, pp, cp as read), as one line; else nothing."""
    for rule in ARGUMENT_RULES:
        if rule.test(options, sizes):
            raise SpecError(f"megatron config: Megatron-LM refuses {rule.what} ({rule.source})")
