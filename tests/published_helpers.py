"""Published records for the validation tests: a Megatron-Bridge-style record to vary field by field, one from a
source without a profile of its own, and the Qwen3 MoE model sections the release-recipe and layout tests share."""

from __future__ import annotations


def record(**over) -> dict:
    """A Megatron-Bridge-style record: Llama3-70B on 64 H100s, fp8, tp 4 / pp 8 / vp 5."""
    rec = {"id": "x", "group": "megatron_bridge_26.04", "framework": "Megatron-Bridge / Megatron-Core",
           "task": "pretrain", "precision": "fp8",
           "model": {"name": "Llama3-70B", "arch": "dense", "num_layers": 80, "hidden_size": 8192, "num_heads": 64,
                     "num_kv_heads": 8, "ffn_hidden_size": 28672, "vocab_size": 128000, "seq_length": 8192},
           "hardware": {"gpu": "H100", "num_gpus": 64, "gpus_per_node": 8},
           "parallel": {"tp": 4, "pp": 8, "dp": None, "cp": 1, "vp": 5, "ep": None, "micro_batch_size": 1,
                        "global_batch_size": 256, "zero_or_fsdp": "DDP (FSDP=0 in table)"},
           "measured": {"tokens_per_s_per_gpu": 1664, "model_tflops_per_gpu": 731},
           "flops_accounting": "Model TFLOP/sec/GPU (NeMo/Megatron-Bridge model-FLOPs formula)"}
    for key, value in over.items():
        rec[key] = rec[key] | value if isinstance(value, dict) else value
    return rec


def indep(framework: str, **over) -> dict:
    """A record from a source without a profile of its own (group 'paper')."""
    return record(group="paper", framework=framework, **over)


QWEN3_30B = {"name": "Qwen3-30B-A3B", "arch": "moe", "num_layers": 48, "hidden_size": 2048, "num_heads": 32,
             "num_kv_heads": 4, "ffn_hidden_size": 6144, "moe_ffn_hidden_size": 768, "num_experts": 128,
             "moe_topk": 8, "vocab_size": 151936, "seq_length": 4096}


QWEN3_235B = QWEN3_30B | {"name": "Qwen3-235B-A22B", "num_layers": 94, "hidden_size": 4096, "num_heads": 64,
                          "ffn_hidden_size": 12288, "moe_ffn_hidden_size": 1536}


_BY_RECORDS: dict[str, tuple] = {}


def validation_of(records, **options) -> tuple:
    """``run_validation(records, **options)``, computed once per test process for the same records and options (keyed
    by their JSON text): a pure function of them. test_docs.py's scripts validate the published runs (accuracy.py) and
    the independent ones (accuracy_doc.py, independent.py) that test_published.py and test_ranges.py validate whole, and
    conftest.py runs these files on one worker. A tuple: its readers copy what they may change."""
    import json  # noqa: PLC0415

    from meshplan_validation.validate import run_validation  # noqa: PLC0415

    key = json.dumps([list(records), sorted(options.items())], sort_keys=True, default=repr)
    if key not in _BY_RECORDS:
        _BY_RECORDS[key] = tuple(run_validation(records, **options))
    return _BY_RECORDS[key]


_VALIDATED: dict[tuple[str, int], tuple] = {}


def validated(path) -> tuple:
    """``run_validation(read_runs(path))`` with its defaults, computed once per test process for the file as it is now
    (keyed by its path and modification time): test_published.py, test_ranges.py and test_validate_records.py each
    validate the published and the independent runs whole, the same pure function of the same file, and conftest.py
    runs the three files on one worker (with test_docs.py, whose scripts validate them too: ``validation_of``). A
    tuple: the tests read the results, none changes them."""
    from pathlib import Path  # noqa: PLC0415

    from meshplan_validation.records import read_runs  # noqa: PLC0415

    path = Path(path).resolve()
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _VALIDATED:
        _VALIDATED[key] = validation_of(read_runs(path))
    return _VALIDATED[key]
