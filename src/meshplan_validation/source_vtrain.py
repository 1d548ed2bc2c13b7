"""What vTrain's released single-node times hold (sources.VTRAIN): the scope of vTrain's own execution graph, not a
Megatron-DeepSpeed step timed end to end.

The released file is composed by vTrain's predictor (VIA-Research/vTrain f8dda847, src/predictor.py create_layer_graph
and predict; Bang et al., MICRO 2024, arXiv 2312.12391), over kernel traces of vTrain's own one-layer model
(src/model/gpt_model.py, gpt_modeling.py) taken by its CUPTI profiler on one GPU (src/trainer.py, profiler/cupti.cpp).
What the release shows of that, on the released half (benchmarks/measure/small_work_scope.py,
benchmarks/measure/small_work_graph.py; data/measured/2026-11-29-vtrain-release-scope.md and
2026-11-29-vtrain-graph-scope.md):

- Once a step: the exposed data-parallel all-reduce of vTrain's nccl-tests table and apex FusedAdam's traced kernels,
  no host loop per parameter tensor (tensor_host 0; Megatron's own loops are sources.MDS_FP16_TENSOR).
- No recompute. create_layer_graph adds a recompute forward only on ranks before the last ("Last rank worker doesn't
  perform recomputation"), so at pp 1 none runs; and those recompute nodes sit on their rank's stream outside the
  micro-batch's dependency chain, so they fill the wait for the gradient and never lengthen the step while the last
  rank is the slowest. The release agrees: one layer's time per micro-batch is the same at pp 1, 2 and 4, and the
  pipeline's fill holds each earlier layer once at that same time (to 1e-6 ms in every group); where the GPU
  dominates (tp 1, hidden 2048, micro-batch 2 -> 4) a sample costs 2.01 ms a layer, 0.75 x meshplan's GPU price of a
  forward, recompute and backward (2.66 ms): three passes' work, not four.
- Each transformer layer's two forward and two backward TP all-reduces are CommNodes on the rank's stream after the
  layer's traced kernels (_add_tp_communication): they add to the layer's time, whatever the host did
  (blocking_collectives), and no collective call is in the trace: the host issues none, so the stack states no host
  time for them (collective_host 0 with collective_host_stated; unstated, HostCost.per_call would charge each a
  kernel's host_dispatch, 4 x 38.4 us a layer the trace does not hold). Stated as the source says, whatever it does
  to the error: median |error| 3.3 -> 3.9 %, tp 8 signed -12.7 -> -16.3 % (benchmarks/measure/small_work_vtrain.py,
  as variant B of data/measured/2026-12-01-vtrain-tp-errors.md foresaw). None for the embedding, the logits or the
  loss.
- Every traced pass priced from an empty queue (drained_passes "layers"), a choice made with the released runs in
  view and registered as such (fitted.py "vTrain passes from an empty queue": out of source it takes "none"). What the
  code shows: the profiled step (src/trainer.py modify_functions) calls the profiler's ``timestamp`` at every
  top-level module's forward start and end and backward start and end, and each flushes the CUPTI records
  (profiler/cupti.cpp: cuptiActivityFlushAll), host work that does not itself synchronise with the GPU (a flush may
  return incomplete records: NVIDIA developer forum, "cuptiActivityFlushPeriod confusion"); the embedding's forward
  synchronises once before the first layer (gpt_modeling.py ShardedGptEmbeddings: ``masked_input_ids[input_ids_mask]
  = 0``, a boolean index, nonzero()). So the queue drains at a boundary only where the flush's host time exceeds the
  queued work; the released traces agree where host and GPU are close: at tp 1 the traced layer lies 0.2-0.5 of the
  way from max(H, G) to H + G (benchmarks/measure/small_work_cell_parts.py), which the flow line from empty prices.
- The model is vTrain's own: the vocabulary unpadded and split as vocab_size // tp rows a rank (ShardedGptEmbeddings,
  ShardedGptLogit: 25,128 at tp 2, so its logit GEMMs are aligned there and odd, 50,257, only at tp 1), and its
  causal mask built on the GPU in ShardedGptModel.forward, outside the traced modules (no CPU mask:
  sources.MDS_CPU_MASK_1024 is Megatron-DeepSpeed's, not this trace's).
- Every all-reduce of the graph, the layers' TP CommNodes (``_add_tp_communication``: b x s x h fp16 bytes over the
  tp ranks) and the gradient's, is timed by ``compute_comm_time`` from the node's own nccl-tests tables
  (trace/a100/AR_GPU{n}_1M_1024M_LUT: the time of the size rounded to whole MiB), not by a model of NCCL: the
  cluster carries those rows (``VTRAIN_ALLREDUCE``, data/measured/2026-11-29-vtrain-a100-allreduce.csv, the sizes the
  released plans need; specs/allreduce_table.py). At small messages they read 1.7-2.2 x NCCL's tuner (2 MiB over 8
  GPUs: 93 us against 53). Above 1024 MiB vTrain divides the size by the 1024-MiB row's bus bandwidth (no ring factor);
  the table prices it at that row's algorithm bandwidth instead (a gradient of tp 1, h2048 at dp >= 2 only).
"""

from __future__ import annotations

import csv
from pathlib import Path

from meshplan.specs.allreduce_table import AllReduceTable
from meshplan.specs.stack import load_stack

VTRAIN_TENSOR = 0.0  # WU nodes: apex FusedAdam's kernels, no per-tensor host loop
VTRAIN_MICROBATCH = 0.0  # the causal mask is GPU work outside the traced modules
VTRAIN_COLLECTIVE_HOST = 0.0  # stated: a TP all-reduce is a CommNode, no call the host issues (docstring above)
VTRAIN_VOCAB = 1  # no vocabulary padding: vocab_size // tp rows a rank (SourceDefaults.vocab_floor)

VTRAIN_LUT = Path(__file__).resolve().parents[2] / "data" / "measured" / "2026-11-29-vtrain-a100-allreduce.csv"


def read_table(path: Path = VTRAIN_LUT) -> AllReduceTable:
    """The node's nccl-tests rows as predictor.get_allreduce_LUT reads them (the time column it keeps)."""
    with path.open() as f:
        rows = tuple((int(r["gpus"]), float(r["size_bytes"]), int(r["time_ns"]) * 1e-9) for r in csv.DictReader(f))
    return AllReduceTable(rows, source="VIA-Research/vTrain f8dda847 trace/a100/AR_GPU{2,4,8}_1M_1024M_LUT")


VTRAIN_ALLREDUCE = read_table()
VTRAIN_STACK = load_stack("megatron-deepspeed").with_(
    name="megatron-deepspeed-megatron-optimizer", optimizer_wrapper="stated", tensor_host=VTRAIN_TENSOR,
    tensor_sharded=True, microbatch_host=VTRAIN_MICROBATCH, collective_host=VTRAIN_COLLECTIVE_HOST,
    collective_host_stated=True, blocking_collectives=True, vocab_multiple=VTRAIN_VOCAB, drained_passes="layers")

VTRAIN_WHY = (
    "vTrain's released single-node times are its own execution graph's (src/predictor.py), not a timed "
    "Megatron-DeepSpeed step: per micro-batch its one-layer model's traced kernels (the module code and host costs of "
    "the megatron-deepspeed preset, vocabulary unpadded, vocab_size // tp rows a rank; each pass from an empty "
    "queue, as traced between the profiler's flushes) with each layer's four TP "
    "all-reduces after its kernels, no recompute (none on the last pipeline rank, whose time sets the step; the "
    "others' hides in their wait for the gradient); once a step the exposed fp16 gradient all-reduce and apex "
    "FusedAdam's kernels, no per-tensor host loop and no CPU causal mask")
