"""What Megatron-LM's README table of January 2021 ran (sources.py "Megatron-LM January 2021"): the code of
NVIDIA/Megatron-LM 152aab30 (2021-01-11, "Readme update + change gpt2 to gpt", NGC PyTorch 20.12), the commit whose
README and images/cases_jan2021.png the records cite. Two things it did that the April 2021 code (Narayanan et al.
2021, 50a4b5fa) no longer does, read in that commit:

- Pipeline sends whole. training.py ``communicate`` posts ``batch_isend_irecv`` of the (seq, micro-batch, hidden)
  tensor from every tensor-parallel rank and waits on it; the scatter/gather that sends 1/t of it per rank and
  all-gathers it over NVLink came with 27fc4689 (authored 2021-01-20, committed 2021-02-09, "Break up tensors sent
  between pipeline stages into smaller chunks that can be all-gathered"; Narayanan et al. 2021 §4.1): the
  "megatron-2021-01" pipeline runtime (specs/stack_variants.PipelineRuntime.sends_whole, cost/pipeline.py).
- A GPT micro-batch must fit the fused softmax kernel. pretrain_gpt.py sets scaled_upper_triang_masked_softmax_fusion
  and the fusion is on by default (arguments.py --no-scaled-masked-softmax-fusion), and fused_softmax.py calls the
  kernel for any fp16 batch with keys <= 2048, with no fallback to PyTorch's softmax (4916bae6, 2021-02-04,
  "conditioning fused kernels", added it). The kernel asserts that the micro-batch times the heads per rank divides
  into its blocks (scaled_upper_triang_masked_softmax.h: TORCH_INTERNAL_ASSERT(attn_batches % batches_per_block == 0),
  4 rows a block at 2,048 keys). So a run of that code whose table leaves out the micro-batch ran one the kernel
  takes: the least such (``least_fused_batch``), not 1. At 48 heads over tp 8 (GPT-18B) micro-batch 1 gives 6 rows:
  it would have stopped at the assertion; 2 gives 12.

The one assumption: the table was measured with the public code of 152aab30 (internal code may have run ahead of
GitHub; the scatter/gather's author date, 2021-01-20, is after the README's commit).
"""

from __future__ import annotations

from meshplan.cost.eager import fused_softmax_runs
from meshplan.specs.model import ModelSpec

JAN2021_SOURCE = "Megatron-LM January 2021"
# the note the least micro-batch carries (map_layout.batches relays it)
LEAST_REASON = f"the least {JAN2021_SOURCE}'s fused softmax kernel takes (source_megatron_jan2021.py)"
JAN2021_RUNTIME = "megatron-2021-01"
JAN2021_WHY = ("Megatron-LM of January 2021 (152aab30, NGC PyTorch 20.12): as Megatron-LM 2021, with pipeline sends "
               "whole from every TP rank (no scatter/gather before 27fc4689) and an unstated micro-batch the least its "
               "fused softmax kernel takes (no PyTorch fallback before 4916bae6)")


def least_fused_batch(model: ModelSpec, tp: int, per_rank: int | None) -> tuple[int, str]:
    """The least micro-batch at which Megatron's fused scale-mask-softmax kernel takes the attention's rows
    (cost/eager.fused_softmax_runs: b·heads/tp a multiple of 4 and of the kernel's rows per block) and which divides
    ``per_rank`` (the global batch per data-parallel rank, when known); 1 where none does (keys past the kernel's
    2,048, or no such divisor). With it, the reason for the mapping's note (map_layout.batches relays it)."""
    top = per_rank or 64
    least = next((b for b in range(1, top + 1)
                  if fused_softmax_runs(model, b, tp) and (per_rank is None or per_rank % b == 0)), 1)
    return least, LEAST_REASON
