"""FSDP2's sharded parameter is the model's own tensor (specs/fsdp_modes.FsdpMode.sharded_master): over torchtitan's
fp32 model it is the fp32 master AdamW updates, and the bf16 weights exist only gathered (memory.model_states).
Sources: pytorch/torchtitan @9dec370 train.py:110-171 (the model built on the meta device in the default fp32 and
materialised by to_empty, never cast), torchtitan/parallelisms/parallelize_llama.py:90-91, 320 (MixedPrecisionPolicy
param_dtype bf16, reduce_dtype fp32), torchtitan/optimizer.py (torch.optim.AdamW over model.parameters())."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.params import stage_params
from meshplan.memory import model_states
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

LLAMA = load_model("llama3-8b")
TITAN = load_stack("torchtitan")
ZERO3 = Plan(dp=8, micro_batch=2, global_batch=16, zero=3)


def test_zero3_holds_16_bytes_a_parameter_not_18():
    """8.03 G parameters over 8 GPUs: fp32 shard 4 (the master, in AdamW's 12 with m and v) + fp32 gradient 4
    (reduce_dtype) = 16 bytes a parameter; no bf16 shard (2 bytes, 1.87 GiB a GPU, counted before)."""
    params = stage_params(LLAMA, ZERO3, True)
    weights, grads, optimizer = model_states(params, ZERO3, TITAN)
    shard = params.total / 8
    assert weights == 0.0
    assert grads == pytest.approx(4 * shard) and optimizer == pytest.approx(12 * shard)
    assert (weights + grads + optimizer) / shard == pytest.approx(16)


def test_the_16_bit_weights_stay_where_they_persist():
    """ZeRO 0-2 keep the gathered bf16 weights through the step (FSDP2 without reshard after forward, torchtitan's
    pipelined ZeRO-1); a model cast to bf16 (KempnerForge, master_weights false) shards its bf16 weights, the only copy;
    FSDP1's flat parameters and DeepSpeed's ZeRO-3 (fp16 partitions beside fp32 ones) are not FSDP2's."""
    params = stage_params(LLAMA, ZERO3, True)
    for z in (0, 1, 2):
        assert model_states(params, replace(ZERO3, zero=z), TITAN)[0] == pytest.approx(2 * params.total)
    assert model_states(params, ZERO3, replace(TITAN, master_weights=False))[0] == pytest.approx(2 * params.total / 8)
    for other in (replace(TITAN, fsdp="fsdp1"), load_stack("deepspeed")):
        assert model_states(params, ZERO3, other)[0] == pytest.approx(2 * params.total / 8)


def test_under_lora_the_frozen_base_keeps_its_16_bit_shard():
    """Under LoRA only the adapters have an fp32 master (trainable: the adapters' optimizer state); the frozen base
    weights have none, so their shard stays priced at 2 bytes a parameter over dp, not 0 (review13)."""
    lora = replace(ZERO3, finetune="lora")
    params = stage_params(LLAMA, lora, True)
    assert model_states(params, lora, TITAN)[0] == pytest.approx(2 * params.total / 8)
