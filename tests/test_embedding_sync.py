"""channels.embedding_sync: the first and the last pipeline stage both hold the word embedding where the head is tied
to it (or multi-token prediction looks it up on the last stage), and all-reduce its gradient once per weight update,
after the backward pass, exposed (Megatron-LM's _allreduce_word_embedding_grads, DeepSpeed's
_exec_reduce_tied_grads)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.collectives.price import collective_time
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import embedding_sync

GPT2 = load_model("gpt2")  # tied head: V = 50,257, h = 768
CLUSTER = load_system("a100").cluster(16)  # two DGX A100: 8 GPUs a node, one 25 GB/s HDR NIC a GPU
# pp 2 outermost: stage 0 on node 0, stage 1 on node 1, so the pair of ranks 8 apart meets over the NICs
PLAN = Plan(dp=8, pp=2, micro_batch=4, global_batch=256, grad_bytes=4)


def test_the_ends_all_reduce_the_embedding_gradient_over_the_network():
    first, last, middle = embedding_sync(GPT2, CLUSTER, PLAN, DEFAULT)
    nbytes = 50257 * 768 * 4  # V/t·h fp32 gradients: 154.4 MB
    assert first == last == pytest.approx(collective_time("all_reduce", nbytes, 2, 8, CLUSTER, DEFAULT))
    assert middle == 0.0  # a middle rank holds neither end
    # a ring over two ranks moves each byte out once and in once: n / B at the NIC's rate (25 GB/s at NCCL's link
    # efficiency), plus NCCL's latencies, a few tens of microseconds: about 6 ms
    nic = CLUSTER.tiers[-1].bandwidth * DEFAULT.link(len(CLUSTER.tiers) - 1)
    assert first == pytest.approx(nbytes / nic, rel=0.02)
    # a 16-bit gradient buffer halves it; t-way vocabulary parallelism splits it t ways
    assert embedding_sync(GPT2, CLUSTER, replace(PLAN, grad_bytes=2), DEFAULT)[0] < first
    tp2 = embedding_sync(GPT2, CLUSTER, replace(PLAN, dp=4, tp=2), DEFAULT)[0]
    assert tp2 < first


@pytest.mark.parametrize("change", [{"pp": 1, "dp": 16}, {"schedule": "zb-v"}, {"schedule": "dualpipe"},
                                    {"finetune": "lora"}])
def test_no_sync_without_two_ends_apart_or_without_an_embedding_gradient(change):
    # one stage holds both; ZB-V puts the head beside the embedding on the first rank; DualPipe's ranks hold both
    # ends of its mirrored pipelines; LoRA trains no embedding
    assert embedding_sync(GPT2, CLUSTER, replace(PLAN, **change), DEFAULT) == (0.0, 0.0, 0.0)


def test_an_untied_head_needs_no_sync_but_multi_token_prediction_does():
    untied = replace(GPT2, tied_embeddings=False)
    assert embedding_sync(untied, CLUSTER, PLAN, DEFAULT) == (0.0, 0.0, 0.0)
    assert embedding_sync(replace(untied, mtp_layers=1), CLUSTER, PLAN, DEFAULT)[0] > 0.0


def test_the_step_pays_it_once_per_update_on_the_busier_end(monkeypatch):
    stack = load_stack("megatron-core")
    est = estimate(GPT2, CLUSTER, PLAN, stack)
    rows = {r.name: r for r in est.ops}
    sync = float(embedding_sync(GPT2, CLUSTER, PLAN, DEFAULT)[0])
    assert rows["pp/embedding_all_reduce"].seconds == pytest.approx(sync)
    assert rows["pp/embedding_all_reduce"].count == 1.0
    # the dp component carries it, exposed: without it the same step is shorter by exactly its time
    import meshplan.step.assemble as assemble

    monkeypatch.setattr(assemble, "embedding_sync", lambda *args: (0.0, 0.0, 0.0))
    # a model object of its own: a plan's weight side is kept by its model's identity (step/assemble._side)
    bare = estimate(replace(GPT2), CLUSTER, PLAN, stack)
    assert est.breakdown["dp"] - bare.breakdown["dp"] == pytest.approx(sync)
    assert est.step_time - bare.step_time == pytest.approx(sync)
    # one stage: no such row
    assert "pp/embedding_all_reduce" not in {r.name for r in estimate(GPT2, CLUSTER, replace(PLAN, pp=1, dp=16),
                                                                       stack).ops}
