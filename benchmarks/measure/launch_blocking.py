"""CUDA_LAUNCH_BLOCKING=1 against asynchronous launches: what meshplan predicts it costs BigScience's stack beside what
BigScience measured (``Stack.blocking_launches``, step/host.py).

BigScience trained BLOOM with CUDA_LAUNCH_BLOCKING=1, the workaround for a hang at 40+ nodes on Jean Zay
(bigscience-workshop/bigscience train/tr11-176B-ml/README.md: "in theory it should make everything much slower but
makes a tiny impact or no impact at all to the throughput"). Before adopting it they timed both on a 200B model
(chronicles-prequel.md, "dealing with JZ hanging on the large model": TP=8, PP=10, MBS=1, NLAYERS=80, NHIDDEN=14400,
NHEADS=96, SEQ_LEN=2048, the second iteration of each run; the table's TFLOPs, so async / blocking TFLOPs is the
blocking run's time over the async one's). Validation maps every tr11 record with blocking launches
(meshplan_validation/sources.py); this script prices the same plans both ways and prints the ratios beside the
measured ones. Nothing is fitted on them.

Run: python benchmarks/measure/launch_blocking.py
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case

SOURCE = ("https://github.com/bigscience-workshop/bigscience/blob/053adafee86d8b0beb10ddd95e5bbbbe3d702f3c/train/"
          "tr11-176B-ml/chronicles-prequel.md")
# (GPUs, GBS, TFLOPs with CUDA_LAUNCH_BLOCKING=1, TFLOPs without): the table's rows with both
MEASURED = ((80, 512, 91.04, 97.20), (160, 512, 84.59, 84.44), (160, 2048, 90.29, 90.25))


def record(gpus: int, gbs: int) -> dict[str, Any]:
    """The 200B plan of the table as a validation record (the prequel's topology-search records' framework text)."""
    dp = gpus // 80
    return {
        "id": f"bigscience-200b-{gpus}gpu-gbs{gbs}", "group": "bloom_prequel_launch_blocking_0217", "source": SOURCE,
        "framework": "Megatron-DeepSpeed (bigscience fork, Feb 2022) with DeepSpeed pipeline engine + ZeRO stage 1; "
                     "fused softmax kernels; no FlashAttention",
        "task": "pretrain",
        "model": {"name": "200B", "arch": "dense", "num_layers": 80, "hidden_size": 14400, "num_heads": 96,
                  "num_kv_heads": 96, "ffn_hidden_size": 4 * 14400, "vocab_size": 250680, "seq_length": 2048},
        "hardware": {"gpu": "A100 SXM4 80GB", "system": "IDRIS Jean Zay (BigScience partition), 8 GPUs/node",
                     "num_gpus": gpus, "gpus_per_node": 8,
                     "interconnect": "NVLink within node; Omni-Path inter-node (4 links per node per BLOOM README)"},
        "parallel": {"tp": 8, "pp": 10, "dp": dp, "micro_batch_size": 1, "global_batch_size": gbs,
                     "grad_accum": gbs // dp, "activation_recompute": "full",
                     "zero_or_fsdp": "ZeRO stage 1 (DeepSpeed)", "pp_schedule": "DeepSpeed pipeline 1F1B"},
        "precision": "fp16",
        "measured": {"iteration_time_s": 1.0},
    }


def rows() -> list[tuple[int, int, float, float, float, float]]:
    """(GPUs, GBS, predicted blocking / async step, measured blocking / async, predicted blocking step s, predicted
    async step s) per row of the table."""
    out = []
    for gpus, gbs, blocked, free in MEASURED:
        case = map_run(record(gpus, gbs))
        assert case.stack.blocking_launches  # the tr11 profile
        on = evaluate_case(case).step_time
        off = evaluate_case(replace(case, stack=case.stack.with_(blocking_launches=False))).step_time
        assert on is not None and off is not None
        out.append((gpus, gbs, on / off, free / blocked, on, off))
    return out


def main() -> None:
    print("CUDA_LAUNCH_BLOCKING=1 over asynchronous launches, step time, BigScience's 200B (TP 8, PP 10, MBS 1):")
    print(f"{'GPUs':>5} {'GBS':>5} {'predicted':>10} {'measured':>9}")
    for gpus, gbs, predicted, measured, _, _ in rows():
        print(f"{gpus:>5} {gbs:>5} {predicted:>10.3f} {measured:>9.3f}")


if __name__ == "__main__":
    main()
