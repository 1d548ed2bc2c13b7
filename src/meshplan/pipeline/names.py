"""The pipeline schedules' names, by family (registry.py holds each one's record; these tuples let the table builders
below it check their arguments without importing it). Outside ``meshplan.pipeline`` no module writes a schedule's
name (tests/test_pipeline_registry.py): it asks the registry."""

from __future__ import annotations

# tables.build's tables: the synchronous one-backward schedules and the asynchronous ones
SYNC = ("gpipe", "1f1b", "interleaved")
# asynchronous pipelines: no flush, weights updated while older micro-batches are in flight (stale weights: training
# semantics differ from synchronous SGD): PipeDream's 1F1B with weight stashing (Narayanan et al., SOSP 2019, §3.2-3.3)
# and PipeDream-2BW's double-buffered weights (Narayanan et al., ICML 2021, §3.1); tables.py, steady.py
ASYNC = ("pipedream", "pipedream-2bw")
TABLED = (*SYNC, *ASYNC)
# split-backward schedules: the backward split into the input gradient (B) and the weight gradient (W), W passes
# moved into the bubble: ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §3.1) and
# DeepSeek-V3's bidirectional DualPipe (arXiv 2412.19437, §3.2.1); zero_bubble.py; with the two-chunk ones of
# zero_bubble_v.py: ZB-V (Qi et al. 2024 §6, V-shaped, 2 chunks per rank) and Chimera (Li & Hoefler 2021,
# bidirectional pipelines of 2 model replicas, its backward whole): the pipelines no preset runs, searched only when
# asked (search.Space.split_backward)
SPLIT = ("zb-h1", "zb-v", "dualpipe", "chimera")
ALL = (*TABLED, *SPLIT)
