"""Reinforcement-learning post-training on one cluster: the rollout on serving's physics, the trainer's passes and
updates on training's, the weight transfer between them on the collectives model, composed per set-up.

In data-flow order: the algorithms (algorithms.py) and the job (job.py: prompts, samples, lengths, mini-batches),
its response lengths (lengths.py), the set-ups (setups.py) and the plan (plan.py: trainer and engine layouts, pools,
the switches colocation needs), the rollout (rollout.py simulated, tail.py in closed form), the trainer's phases
(trainer.py), the weight transfer (sync.py), the switches (switches.py), memory per phase (memory.py), the
iteration's timeline (timeline.py), the estimate that composes them (estimate.py) and the search (search.py).

    from meshplan import load_model, load_system
    from meshplan.rl import RLJob, rl_search

    job = RLJob(prompts=512, samples_per_prompt=8, input_len=1024, output_len=4096)
    best = rl_search(load_model("qwen3-30b-a3b"), load_system("h100"), 16, job).plans[0]
    print(best.plan.describe(), best.iteration_time, best.phases)
"""

from meshplan.rl.estimate import RLEstimate, rl_estimate
from meshplan.rl.job import RLJob
from meshplan.rl.plan import RLPlan
from meshplan.rl.search import RLSearchResult, RLSpace, rl_search

__all__ = ["RLEstimate", "RLJob", "RLPlan", "RLSearchResult", "RLSpace", "rl_estimate", "rl_search"]
