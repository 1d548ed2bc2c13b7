"""``meshplan serve --rate / --concurrency / --trace``: one configuration's percentiles, the ranked search and the
recommendation under a load, as tables and JSON; bad input as one line and exit 2."""

from __future__ import annotations

import json

import pytest

from meshplan.cli.main import main

BASE = ["serve", "--model", "llama3-8b", "--system", "h100", "--input-len", "1000", "--output-len", "200"]
ONE = ["--gpus", "1", "--tp", "1", "--pp", "1", "--dpa", "1", "--ep", "1", "--batch", "256", "--replicas", "1",
       "--prefill-replicas", "0"]


def run(capsys, args: list[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_one_configuration_under_a_rate(capsys):
    """10 requests/s of 1,000 / 200 tokens on one H100: every request completes, p50 <= p99, the TPOT near serve's
    steady state at the batch the load keeps (a lightly loaded engine: 8-11 ms a token, serve's 8.2 ms at 16), no
    preemption, and every request within 500 ms / 50 ms targets (goodput = throughput)."""
    code, out, _ = run(capsys, BASE + ONE + ["--rate", "10", "--requests", "400", "--ttft-slo", "500ms",
                                              "--tpot-slo", "50ms", "--json"])
    d = json.loads(out)
    assert code == 0 and d["percentile"] == 99
    (p,) = d["plans"]
    assert p["completed"] == 400 and p["meets_targets"] and p["preemptions"] == 0
    assert p["ttft_p50_s"] <= p["ttft_p99_s"] and 0.007 < p["tpot_p50_s"] < 0.012
    assert p["goodput_requests_per_s"] == pytest.approx(p["requests_per_s"])


def test_table_and_a_trace(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_len,output_len\n" + "".join(f"{i * 0.1},{500 + i},{100}\n" for i in range(50)))
    code, out, _ = run(capsys, BASE + ONE + ["--trace", str(trace)])
    assert code == 0 and "TTFT p99" in out and "configuration under the load" in out


def test_recommend_gives_the_fewest_gpus(capsys):
    """Llama 3 70B at 10 ShareGPT requests/s under p99 targets of 500 ms / 50 ms on up to 16 H100s: the first
    recommendation uses no more GPUs than any other listed, meets the targets, and costs $/hour = GPUs · price."""
    code, out, _ = run(capsys, ["serve", "--model", "llama3-70b", "--system", "h100", "--gpus", "16", "--input-len",
                                "161", "--output-len", "338", "--rate", "10", "--lengths", "sharegpt", "--requests",
                                "300", "--ttft-slo", "500ms", "--tpot-slo", "50ms", "--recommend", "--price", "2",
                                "--top", "3", "--json"])
    plans = json.loads(out)["plans"]
    assert code == 0 and plans and all(p["meets_targets"] for p in plans)
    assert plans[0]["gpus"] == min(p["gpus"] for p in plans)
    assert plans[0]["dollars_per_hour"] == 2 * plans[0]["gpus"]
    assert all(p["ttft_p99_s"] <= 0.5 and p["tpot_p99_s"] <= 0.05 for p in plans)


@pytest.mark.parametrize("extra,field", [
    (["--rate", "0"], "rate=0.0 must be from"),
    (["--concurrency", "0"], "concurrency=0 must be from"),
    (["--rate", "1", "--concurrency", "2"], "give one load"),
    (["--lengths", "sharegpt"], "--lengths: applies under a load"),
    (["--rate", "1", "--lengths", "zipf"], "lengths='zipf' must be"),
    (["--rate", "1", "--prefix-hit", "1.5"], "prefix-hit=1.5 must be from 0 to 1"),
    (["--prefix-hit", "-0.1"], "prefix-hit=-0.1 must be from 0 to 1"),
    (["--trace", "missing.csv"], "trace='missing.csv'"),
    (["--rate", "1", "--recommend"], "--recommend: give a target"),
    (["--rate", "1", "--percentile", "75"], "percentile"),
        (["--rate", "1", "--scheduler", "orca"], "scheduler="),
])
def test_bad_load_input_is_one_line_and_exit_2(capsys, extra, field):
    code, out, err = run(capsys, BASE + ["--gpus", "1"] + extra)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1, err


def test_report_under_a_load_draws_latency_against_the_load(capsys, tmp_path):
    """--report under a load: the steady-state search's page with the load's section: TTFT and TPOT at p50 and p99
    over seven levels of the rate (a quarter to twice 10 requests/s), the TTFT target a rule, the KV timeline."""
    path = tmp_path / "load.html"
    code, out, _ = run(capsys, BASE + ["--gpus", "2", "--tp", "1", "--rate", "10", "--requests", "200",
                                       "--ttft-slo", "500ms", "--top", "2", "--report", str(path)])
    html = path.read_text()
    assert code == 0 and f"wrote {path}" in out
    assert "Under load" in html and "TTFT against the load" in html and "KV-cache occupancy over the run" in html
    assert '"percentile":"p99"' in html.replace(" ", "") and '"y":500.0' in html.replace(" ", "")


def test_speculative_under_a_load(capsys):
    code, out, _ = run(capsys, BASE + ONE + ["--rate", "2", "--requests", "100", "--speculative", "3:0.7", "--json"])
    d = json.loads(out)
    assert code == 0 and d["speculative"]["tokens_per_step"] == pytest.approx(2.533, abs=1e-3)
    for bad, field in (("3", "must be K:ALPHA"), ("0:0.5", "draft tokens must be from 1"),
                       ("3:1.5", "acceptance=1.5 must be from 0 to 1"), ("3:0.5:nomodel", "nomodel")):
        code, _, err = run(capsys, BASE + ONE + ["--rate", "2", "--speculative", bad])
        assert code == 2 and field in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run(capsys, BASE + ONE + ["--speculative", "3:0.7"])
    assert code == 2 and "--speculative: applies under a load" in err


def test_recommend_splits_into_pools_when_prompts_stall_the_decodes(capsys):
    """Llama 3 8B at 8 requests/s of 4,000-token prompts under p99 TPOT <= 11 ms (bf16, tp = 1): co-located
    instances meet it only when the prompts are spread thin (4 GPUs); one prefill and one decode instance meet it on
    2 (DistServe's case): --recommend lists the split first, and --no-disaggregate leaves it out. (9 ms when each
    kernel's fixed time was 1.5 us, before it was measured on Hopper: 5 GPUs against 2; 10 ms before vLLM V1's engine
    core was measured, 0.29 ms + 22 us a sequence an iteration, which at 10 ms takes 1P+2D, 3 GPUs against 5.)"""
    args = ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--input-len", "4000",
            "--output-len", "200", "--rate", "8", "--requests", "400", "--tpot-slo", "11ms", "--ttft-slo", "2s",
            "--recommend", "--quant", "bf16", "--tp", "1", "--pp", "1", "--json"]
    code, out, _ = run(capsys, args)
    plans = json.loads(out)["plans"]
    assert code == 0 and "1P+1D" in plans[0]["plan"] and plans[0]["gpus"] == 2
    assert all(p["gpus"] > 2 for p in plans if "P+" not in p["plan"])
    code, out, _ = run(capsys, [*args, "--no-disaggregate"])
    assert code == 0 and all("P+" not in p["plan"] for p in json.loads(out)["plans"])
