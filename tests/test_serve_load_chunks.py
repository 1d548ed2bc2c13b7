"""Two defects a review found in the load simulator (serve/load/): a closed loop of fewer clients than replicas sent
every request at once, and a prompt's chunks were priced without the tokens of their prompt already cached."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.errors import SpecError
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.arrivals import Requests, closed
from meshplan.serve.load.lengths import parse_lengths
from meshplan.serve.load.run import load_run
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

MODEL, ENGINE = load_model("llama3-8b"), load_engine("vllm")


@pytest.mark.parametrize("replicas", [2, 4])
def test_a_closed_loop_never_holds_more_requests_than_clients(replicas):
    """Two clients on 2 or 4 replicas: at most two requests in the system on average, the same throughput either
    way (the replicas past the clients idle)."""
    result = load_run(MODEL, load_system("h100").cluster(replicas), ServePlan(batch=64, replicas=replicas),
                      closed(2, 200, parse_lengths("fixed", 1000, 200)), ENGINE)
    assert result.in_system == pytest.approx(2.0, rel=0.02)


def test_a_closed_loop_through_two_pools_is_refused():
    with pytest.raises(SpecError, match="closed loop through prefill and decode pools"):
        load_run(MODEL, load_system("h100").cluster(2), ServePlan(batch=64, replicas=1, prefill_replicas=1),
                 closed(2, 20, parse_lengths("fixed", 1000, 200)), ENGINE)


def test_a_long_prompt_s_chunks_pay_for_the_tokens_before_them():
    """One 32,000-token prompt under vLLM's 8,192-token budget: four chunks, the k-th after 8,192·k tokens of its
    prompt. Its first token is the sum of Setting.time over the chunks with those prefixes (within the grid's
    interpolation), well above the same chunks priced as if alone."""
    cluster = load_system("h100").cluster(1)
    result = load_run(MODEL, cluster, ServePlan(batch=64), Requests(np.zeros(1), np.array([32000]), np.array([2])),
                      ENGINE)
    setting = Setting(MODEL, cluster, plan_columns(ServePlan(batch=64)), ServePlan(batch=64).quant, ENGINE,
                      Workload(input_len=1, output_len=1), SERVE_DEFAULT)
    budget = ENGINE.max_batched_tokens
    chunks = [(min(budget, 32000 - start), start) for start in range(0, 32000, budget)]
    with_prefix = sum(float(setting.time(0.0, n, 1.0, before)) for n, before in chunks)
    alone = sum(float(setting.time(0.0, n, 1.0, 0.0)) for n, _ in chunks)
    assert with_prefix > 1.2 * alone
    assert result.ttft[50] == pytest.approx(with_prefix, rel=0.05)
