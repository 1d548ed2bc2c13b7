"""The RL iteration (meshplan/rl/): the job's checks, the response lengths, the weight transfer's arithmetic, the
timeline's composition per set-up, the phases each algorithm runs and the memory of each phase, each shown with its
arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan import Plan, load_model, load_system
from meshplan.errors import SpecError
from meshplan.rl import RLJob, RLPlan, rl_estimate
from meshplan.rl.lengths import capped_mean, capped_mu, response_lengths
from meshplan.rl.rollout import grouped_requests
from meshplan.rl.setups import SETUPS
from meshplan.rl.sync import checkpoint_tensors, sync_time
from meshplan.rl.timeline import iteration
from meshplan.roofline import stream_bandwidth
from meshplan.serve.memory import weight_bytes
from meshplan.serve.plan import ServePlan
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.stack import load_stack

H100 = load_system("h100")
LLAMA = load_model("llama3-8b")
MEGATRON = load_stack("megatron-core")


def small_job(**changes) -> RLJob:
    base = {"prompts": 32, "samples_per_prompt": 4, "input_len": 256, "output_len": 512, "mini_batches": 2}
    return RLJob(**(base | changes))


def colocated(gpus: int = 8, **changes) -> RLPlan:
    trainer = Plan(dp=gpus // 2, tp=2, micro_batch=4, global_batch=64)
    engine = ServePlan(tp=1, batch=256, replicas=gpus)
    return RLPlan(**({"setup": "colocated", "trainer": trainer, "engine": engine, "train_gpus": gpus,
                      "rollout_gpus": gpus, "offload": "all"} | changes))


def split(gpus: int = 8, rollout: int = 4, **changes) -> RLPlan:
    trainer = Plan(dp=(gpus - rollout) // 2, tp=2, micro_batch=4, global_batch=64)
    engine = ServePlan(tp=1, batch=256, replicas=rollout)
    return RLPlan(**({"setup": "split", "trainer": trainer, "engine": engine, "train_gpus": gpus - rollout,
                      "rollout_gpus": rollout} | changes))


# ---- the job -----------------------------------------------------------------------------------------------------


def test_the_jobs_counts():
    job = small_job(prompts=512, samples_per_prompt=8, mini_batches=4, epochs=2)
    assert job.sequences == 512 * 8 == 4096
    assert job.mini_batch == 4096 // 4 == 1024
    assert job.updates == 2 * 4
    assert job.train_seq == 256 + 512  # fixed lengths: every response output_len, packed


@pytest.mark.parametrize("changes, field", [
    ({"samples_per_prompt": 1}, "samples_per_prompt=1 must be at least 2"),  # GRPO's group baseline
    ({"mini_batches": 3}, "mini_batches=3 must divide"),  # 32 x 4 = 128 sequences
    ({"mean_output": 600.0, "lengths": "lognormal"}, "mean_output=600 must be at most output_len=512"),
    ({"lengths": "lognormal"}, "needs mean_output"),
    ({"algorithm": "trpo"}, "algorithm='trpo' must be one of"),
    ({"prompts": 0}, "prompts=0 is outside"),
    ({"oversample": 0.5}, "oversample=0.5 is outside"),
])
def test_a_bad_job_is_one_line_naming_the_field(changes, field):
    with pytest.raises(SpecError, match=field.replace("(", r"\(").replace("+", r"\+")):
        small_job(**changes)


def test_the_algorithms_choose_their_passes():
    ppo = small_job(algorithm="ppo", samples_per_prompt=1)
    assert ppo.uses_critic and ppo.uses_reference
    dapo = small_job(algorithm="dapo")
    assert not dapo.uses_critic and not dapo.uses_reference  # DAPO drops the KL term (Yu et al. 2025 §2.3)
    assert small_job(algorithm="dapo", reference=True).uses_reference  # the user's word wins


# ---- the response lengths ----------------------------------------------------------------------------------------


def test_fixed_lengths_are_the_cap():
    assert set(response_lengths(small_job()).tolist()) == {512}


def test_a_capped_lognormal_keeps_the_asked_mean():
    mu = capped_mu(1000.0, 4096.0, 0.9)
    assert capped_mean(mu, 0.9, 4096.0) == pytest.approx(1000.0, rel=1e-9)
    job = small_job(prompts=2048, output_len=4096, lengths="lognormal", mean_output=1000.0)
    drawn = response_lengths(job)
    assert drawn.max() == 4096 and drawn.min() >= 1  # the tail reaches the cap
    assert drawn.mean() == pytest.approx(1000.0, rel=0.03)  # 8,192 draws of a sigma-0.9 log-normal
    assert np.array_equal(drawn, response_lengths(job))  # seeded: the same job, the same lengths


def test_groups_stay_on_one_instance():
    """8 prompts x 2 samples over 4 instances: instance k takes the groups k and k + 4, both samples of each."""
    job = small_job(prompts=8, samples_per_prompt=2, mini_batches=1)
    lengths = np.arange(16)  # response i belongs to group i // 2
    reqs = grouped_requests(job, lengths, 4)
    assert reqs.share(1, 4).output_len.tolist() == [2, 3, 10, 11]  # groups 1 and 5


# ---- the weight transfer -----------------------------------------------------------------------------------------


def test_a_dense_models_checkpoint_tensors():
    """Llama 3 8B as Hugging Face names it: per layer q, k, v, o, gate, up, down and two norms (9), 32 layers, the
    embedding, the final norm and the untied LM head: 9 x 32 + 3 = 291."""
    assert checkpoint_tensors(LLAMA) == 9 * 32 + 3


def test_local_transfer_is_hbm_copies():
    """Colocated, one GPU copies the full weights into the bucket and reads them (2W), and the engine reads the
    tensors and writes its shard (W + W/tp): (3W + W/tp) / the streaming rate; a tp = 1 trainer gathers nothing."""
    pool = H100.cluster(8)
    plan, engine = Plan(dp=8), ServePlan(tp=2, replicas=4)
    moved = sync_time(LLAMA, pool, (pool, plan, MEGATRON), engine, "local")
    w = float(weight_bytes(LLAMA, 1, 1, 1, engine.quant))
    shard = float(weight_bytes(LLAMA, 2, 1, 1, engine.quant))
    assert moved.gather == 0.0
    assert moved.transfer == pytest.approx((3 * w + shard) / stream_bandwidth(pool.accelerator, DEFAULT))
    assert moved.host == pytest.approx(291 * 5 * MEGATRON.host_dispatch)  # 5 launches per tensor, x86 host


def test_a_broadcast_across_nodes_is_slower_than_a_local_copy():
    whole = H100.cluster(16)
    trainer = (H100.cluster(8), Plan(dp=4, tp=2), MEGATRON)
    engine = ServePlan(tp=1, replicas=8)
    local = sync_time(LLAMA, whole, trainer, engine, "local")
    broadcast = sync_time(LLAMA, whole, trainer, engine, "broadcast")
    assert broadcast.gather == local.gather > 0  # the same gather over tp = 2
    # 16 GB over one sender's 50 GB/s NIC: at least 0.32 s
    assert broadcast.transfer > 16e9 / 50e9 > local.transfer


# ---- the timeline ------------------------------------------------------------------------------------------------


PHASES = {"sync": 2.0, "rollout": 10.0, "old_log_prob": 1.0, "reference": 1.0, "actor_update": 5.0}


def test_colocated_phases_follow_each_other():
    segments, total = iteration(SETUPS["colocated"], PHASES, staleness=1)
    assert total == 2 + 10 + 1 + 1 + 5
    assert [s.phase for s in segments] == ["sync", "rollout", "old_log_prob", "reference", "actor_update"]
    assert all(a.end == b.start for a, b in zip(segments, segments[1:], strict=False))


def test_split_pools_overlap_one_step_off():
    """The rollout (10 s) beside the trainer (1 + 1 + 5 = 7 s), then the transfer on both: max(10, 7) + 2."""
    segments, total = iteration(SETUPS["split"], PHASES, staleness=1)
    assert total == max(10, 7) + 2
    assert {s.pool for s in segments if s.phase == "sync"} == {"train", "rollout"}


def test_on_policy_split_pools_take_turns():
    segments, total = iteration(SETUPS["split"], PHASES, staleness=0)
    assert total == 10 + 7 + 2


# ---- the estimate ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def colocated_estimate():
    return rl_estimate(LLAMA, H100, small_job(), colocated(), MEGATRON)


def test_a_colocated_iteration_is_its_phases_in_turn(colocated_estimate):
    e = colocated_estimate
    assert e.fits, e.reasons
    assert e.iteration_time == pytest.approx(sum(e.phases.values()))
    assert {"rollout", "sync", "old_log_prob", "reference", "actor_update"} <= set(e.phases)
    assert "critic_update" not in e.phases  # GRPO has no critic
    # the update: 2 mini-batches of 64 sequences, each a training step of the trainer's plan
    assert e.phases["actor_update"] == pytest.approx(2 * e.update.step_time)
    assert e.samples_per_s_per_gpu == pytest.approx(128 / e.iteration_time / 8)


def test_the_band_weighs_the_phases(colocated_estimate):
    """The rollout carries serving's band, the rest training's; the iteration's is their mean weighted by time."""
    e = colocated_estimate
    rollout, rest = e.bands["rollout"], e.bands["actor_update"]
    share = e.phases["rollout"] / sum(e.phases.values())
    assert e.error_band == pytest.approx(share * rollout + (1 - share) * rest)


def test_colocated_memory_per_phase(colocated_estimate):
    """Offloading everything, the rollout holds the engine alone (its share of what the trainer leaves: all of it);
    the update holds the trainer's parts and the sleeping engine's workspace."""
    e = colocated_estimate
    rollout = next(m for m in e.memory if m.phase == "rollout")
    assert not any(k.startswith("trainer") for k in rollout.parts)
    assert rollout.total == pytest.approx(e.engine.memory_utilization * e.cluster.accelerator.hbm_bytes, rel=0.01)
    update = next(m for m in e.memory if m.phase == "actor_update")
    assert update.total == pytest.approx(sum(e.update.memory.values()) + e.engine.workspace)


def test_ppo_adds_the_critics_passes():
    e = rl_estimate(LLAMA, H100, small_job(algorithm="ppo", samples_per_prompt=1, prompts=128), colocated(),
                    MEGATRON)
    assert e.phases["critic_update"] == pytest.approx(e.phases["actor_update"])  # the critic is the policy's size
    assert e.phases["critic_values"] == pytest.approx(e.phases["old_log_prob"])


def test_a_resident_trainer_shrinks_the_engines_share():
    none = rl_estimate(LLAMA, H100, small_job(), colocated(offload="none"), MEGATRON)
    held = sum(none.update.memory[k] for k in ("weights", "grads", "optimizer"))
    hbm = H100.accelerator.hbm_bytes
    assert none.engine.memory_utilization == pytest.approx(0.9 * (hbm - held) / hbm)


def test_split_pools_transfer_by_broadcast():
    e = rl_estimate(LLAMA, H100, small_job(), split(), MEGATRON)
    assert e.fits, e.reasons
    assert e.plan.sync_method == "broadcast"
    rollout = next(s for s in e.segments if s.phase == "rollout")
    assert rollout.pool == "rollout" and rollout.start == 0.0
    train = [s for s in e.segments if s.pool == "train" and s.phase != "sync"]
    assert train[0].start == 0.0  # one step off: the trainer starts with the rollout
    assert e.iteration_time == pytest.approx(max(rollout.end, train[-1].end) + e.phases["sync"])


def test_a_plan_that_cannot_fit_says_why():
    big = load_model("llama3-70b")
    e = rl_estimate(big, H100, small_job(), colocated(offload="none"), MEGATRON)
    assert not e.fits and any("memory" in r or "KV cache" in r for r in e.reasons)


@pytest.mark.parametrize("changes, message", [
    ({"setup": "colocated", "rollout_gpus": 4}, "must equal rollout_gpus=4"),
    ({"offload": "everything"}, "offload='everything' must be one of"),
    ({"sleep_level": 3}, "sleep_level=3 must be 1"),
])
def test_a_bad_plan_is_one_line(changes, message):
    with pytest.raises(SpecError, match=message):
        colocated(**changes)


def test_streaming_has_no_tail():
    e = rl_estimate(LLAMA, H100, small_job(lengths="lognormal", mean_output=200.0), split(setup="async"), MEGATRON)
    assert e.rollout.method == "steady state" and e.rollout.tail_share == 0.0
    assert e.rollout.seconds == pytest.approx(e.rollout.tokens / e.rollout.steady_tokens_per_s)
    assert math.isfinite(e.iteration_time)
