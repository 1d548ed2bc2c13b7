"""``meshplan serve``: the search's tables and JSON, one configuration priced, the HTML report (self-contained), bad
input as one line and exit 2; docs/SERVING.md's commands parse and its Python example runs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from meshplan.cli.main import cli, main

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "docs" / "SERVING.md"
BASE = ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--input-len", "512", "--output-len", "128"]


def run(capsys, args: list[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_search_prints_the_best_the_detail_and_the_rejected(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    code, out, _ = run(capsys, BASE + ["--tpot-slo", "30ms", "--price", "2", "--top", "3"])
    assert code == 0
    for text in ("best serving configurations", "TPOT ≤ 30 ms", "the best configuration in detail", "memory per GPU",
                 "decode step by op", "rejected:", "configurations in", "$/Mtok"):
        assert text in out, text


def test_json_is_one_object_with_plans_and_rejections(capsys):
    code, out, _ = run(capsys, BASE + ["--ttft-slo", "500ms", "--json", "--quant", "bf16,fp8"])
    d = json.loads(out)
    assert code == 0 and d["evaluated"] == d["feasible"] + d["rejected"]["count"]
    assert all(p["ttft_s"] <= 0.5 and p["fits"] for p in d["plans"])
    assert {p["plan"]["weights"] for p in d["plans"]} <= {"bf16", "fp8"}


def test_every_axis_fixed_prices_one_configuration(capsys):
    fixed = ["--tp", "2", "--pp", "1", "--dpa", "1", "--ep", "1", "--batch", "32", "--replicas", "2",
             "--prefill-replicas", "1", "--quant", "fp8/fp8/fp8", "--json"]
    code, out, _ = run(capsys, BASE + fixed)
    d = json.loads(out)
    assert code == 0 and d["gpus"] == 6 and d["plan"]["prefill_replicas"] == 1 and d["plan"]["kv_cache"] == "fp8"


def test_the_report_is_one_self_contained_page(tmp_path, capsys):
    """--report writes the page of the search it printed (tests/test_serve_report.py tests the page itself)."""
    pytest.importorskip("jinja2")
    pytest.importorskip("vl_convert")
    path = tmp_path / "serve.html"
    code, out, _ = run(capsys, BASE + ["--tpot-slo", "50ms", "--report", str(path)])
    page = path.read_text()
    assert code == 0 and page.startswith("<!DOCTYPE html>") and f"wrote {path}" in out
    for section in ("plans", "curves", "space", "memory", "step", "trust", "rejected"):
        assert f'<section id="{section}"' in page
    assert "Throughput against latency" in page and "search took" in page


@pytest.mark.parametrize(("extra", "field"), [
    (["--tpot-slo", "fast"], "tpot-slo"), (["--quant", "fp7"], "weights"), (["--engine", "tgi"], "engine"),
    (["--price", "-1"], "price"), (["--tp", "3"], ""), (["--batch", "0"], "batch")])
def test_bad_input_is_one_line_and_exit_2(capsys, extra, field):
    code, out, err = run(capsys, BASE + extra)
    if extra == ["--tp", "3"]:  # a size that divides nothing is a rejection, not an error
        assert code == 0 and "tp does not divide the attention heads" in out
        return
    assert code == 2 and len(err.strip().splitlines()) == 1 and field in err


def test_a_plan_larger_than_the_cluster_is_refused(capsys):
    fixed = ["--tp", "8", "--pp", "2", "--dpa", "1", "--ep", "1", "--batch", "8", "--replicas", "1",
             "--prefill-replicas", "0"]
    code, _, err = run(capsys, BASE + fixed)
    assert code == 2 and "16 GPUs" in err


def test_serving_doc_commands_parse_and_its_example_runs():
    text = SERVING.read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.strip().splitlines():
            words = shlex.split(line)
            cli.commands[words[1]].make_context(words[1], words[2:])
    (example,) = re.findall(r"```python\n(.*?)```", text, re.S)
    namespace: dict = {}
    exec(compile(example, str(SERVING), "exec"), namespace)
    assert namespace["est"].fits and namespace["best"].metrics.tpot <= 0.05


def test_a_prefix_hit_prices_the_search_and_one_configuration_past_the_cached_pages(capsys):
    """--prefix-hit without a load: 0.5 of each 512-token prompt in vLLM's 16-token pages is 256 cached tokens, in the
    search's JSON and in one fixed configuration's; the prompts cost less, so TTFT falls and throughput rises."""
    _, cold, _ = run(capsys, BASE + ["--json", "--top", "1"])
    code, warm, err = run(capsys, BASE + ["--json", "--top", "1", "--prefix-hit", "0.5"])
    cold, warm = json.loads(cold), json.loads(warm)
    assert code == 0, err
    assert cold["cached_len"] == 0 and warm["cached_len"] == 256
    fixed = ["--tp", "1", "--pp", "1", "--dpa", "1", "--ep", "1", "--batch", "64", "--replicas", "8",
             "--prefill-replicas", "0", "--json"]
    _, one_cold, _ = run(capsys, BASE + fixed)
    _, one_warm, _ = run(capsys, BASE + fixed + ["--prefix-hit", "0.5"])
    one_cold, one_warm = json.loads(one_cold), json.loads(one_warm)
    assert one_warm["cached_len"] == 256 and one_warm["ttft_s"] < one_cold["ttft_s"]
    assert one_warm["output_tokens_per_s"] > one_cold["output_tokens_per_s"]
