"""Run in a subprocess whose path starts with Megatron-LM's own code (tests/framework_parsers.py: megatron-core 0.17.0's
wheel, ``megatron/training`` and ``megatron/core`` of tag core_v0.17.0): for each case it is handed, what
pretrain_gpt.py does with its command line before it builds a model (megatron/training/initialize.py
``initialize_megatron``: ``parse_args``, then ``validate_args``; pretrain_gpt.py's ``model_provider`` then
``core_transformer_config_from_args``, which builds Megatron-Core's TransformerConfig / MLATransformerConfig and
runs its checks). Its verdict on a case: ``{"ok": true, ...}`` (what Megatron built) or ``{"ok": false, "error": ...}``.

A case: ``argv`` (the arguments bash handed pretrain_gpt.py), ``env`` (the variables the script exported),
``world_size`` (torchrun's WORLD_SIZE) and ``capability`` (the GPU's compute capability: the two device queries
validate_args makes, ``torch.cuda.get_device_capability`` for grouped GEMM and ``get_device_properties().major``
for CUDA_DEVICE_MAX_CONNECTIONS, answered as the target GPU would, since this machine has none). RoPE fusion is
set off before the TransformerConfig is built: it is Transformer Engine's kernel, and TransformerConfig refuses it
where TE is not installed (a CUDA build), whatever the arguments.

One process serves many cases (its imports take ~10 s, a case ~0.2 s): it reads one JSON list of cases a line on
stdin and answers each line with one line of verdicts (a JSON list) on stdout, until its input ends. Each case starts
from the process's starting state in what this path reads: ``sys.argv`` and the device queries are set per case, and
``os.environ`` is put back to the environment the process started with (less the two variables a script exports)
before the case's own are set. ``parse_args`` builds a new parser and namespace each time; ``validate_args`` and
``core_transformer_config_from_args`` change that namespace and the config they build, and of Megatron's globals
only caches of installed packages' versions (megatron/core/utils.py ``get_te_version`` and its kin) and the
multi-storage-client flag (megatron/core/msc_utils.py, off where the package is absent, as here).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types
import warnings


def _device(capability: list[int]) -> None:
    import torch

    major, minor = capability
    torch.cuda.get_device_capability = lambda *args, **kwargs: (major, minor)
    torch.cuda.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(major=major, minor=minor)


def _run(case: dict, environ: dict[str, str]) -> dict:
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args

    _device(case["capability"])
    os.environ.clear()  # what an earlier case exported is gone
    os.environ.update(environ)
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(case["world_size"]), **case["env"]})
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parse_args()
            validate_args(args, {})
            args.apply_rope_fusion = False  # Transformer Engine's kernel: TransformerConfig checks that TE is there
            config = core_transformer_config_from_args(args)
    except SystemExit:  # argparse: its message on stderr
        return {"ok": False, "error": " ".join(err.getvalue().strip().splitlines()[-1:])}
    except Exception as exc:  # validate_args' assertions, TransformerConfig's checks
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "config": type(config).__name__,
            "sizes": [config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
                      config.context_parallel_size, config.expert_model_parallel_size,
                      config.virtual_pipeline_model_parallel_size or 1],
            "recompute": [config.recompute_granularity, config.recompute_method, config.recompute_num_layers],
            "batch": [args.micro_batch_size, args.global_batch_size], "sequence_parallel": config.sequence_parallel,
            "distributed_optimizer": args.use_distributed_optimizer, "offload": args.optimizer_cpu_offload,
            "overlaps": [args.overlap_grad_reduce, args.overlap_param_gather, args.overlap_p2p_comm],
            "num_layers": config.num_layers, "experts": config.num_moe_experts,
            "activation": getattr(config.activation_func, "__name__", str(config.activation_func)),
            "dispatcher": [config.moe_token_dispatcher_type, config.moe_flex_dispatcher_backend],
            "capacity": [config.moe_expert_capacity_factor, config.moe_pad_expert_input_to_capacity]}


def _field_docstrings_once() -> None:
    """``parse_args`` builds its parser anew for each case, and its ArgumentGroupFactory reads the help text of each
    config class's fields by parsing the class's source (megatron/training/argument_utils.py ``_get_field_docstrings``,
    inspect.getsource + ast.parse: ~90 % of a case). The source does not change while this process runs: each class's
    are read once, and each parser gets the same help text (a copy) as before."""
    from megatron.training.argument_utils import ArgumentGroupFactory

    read, seen = ArgumentGroupFactory._get_field_docstrings, {}

    def once(self, src_cfg_class: type) -> dict[str, str]:
        if src_cfg_class not in seen:
            seen[src_cfg_class] = read(self, src_cfg_class)
        return dict(seen[src_cfg_class])

    ArgumentGroupFactory._get_field_docstrings = once


def main() -> None:
    warnings.simplefilter("ignore")  # Megatron warns that Transformer Engine and Apex are missing
    replies = os.fdopen(os.dup(1), "w")  # the verdicts' own channel; whatever else writes to stdout goes to stderr
    os.dup2(2, 1)
    import megatron.training.arguments  # noqa: F401  the seconds of imports, while the parent writes its first cases
    _field_docstrings_once()

    environ = {k: v for k, v in os.environ.items() if k not in ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_CPU_OFFLOAD_V1")}
    for line in sys.stdin:
        replies.write(json.dumps([_run(case, environ) for case in json.loads(line)]) + "\n")
        replies.flush()
    os._exit(0)  # nothing to tidy: the interpreter's teardown of torch takes seconds


if __name__ == "__main__":
    main()
