"""``meshplan serve``'s defaults (issue 48, item 13): it serves the checkpoint's precision unless ``--quant`` asks for
another, it ranks within the serving error band as training does (simplest first), and where a TTFT target filters
it says how far the predicted TTFT was from published runs (presets/error_bands.json's serving tables, read through
specs/bands.py for the search's regime, not restated)."""

from __future__ import annotations

import json

from meshplan.cli.main import main
from meshplan.serve.search import search_regime
from meshplan.serve.space import ServeSpace
from meshplan.specs.bands import serving_latency_error, serving_ranking_band
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

BASE = ["serve", "--model", "llama3-70b", "--system", "h100", "--gpus", "16", "--input-len", "1024",
        "--output-len", "256", "--tpot-slo", "50ms"]  # the README's command


def regime() -> dict[str, str]:
    """The README command's regime: vLLM on 16 H100 (specs/regime.py)."""
    space = ServeSpace(input_len=1024, output_len=256, tpot_slo=0.05)
    return search_regime(load_model("llama3-70b"), load_system("h100").cluster(16), space)


def answer(capsys, args: list[str]) -> str:
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_the_readme_command_serves_16_bits_and_quantises_only_when_asked(capsys):
    """Every listed configuration of the README's command is bf16 in every part; ``--quant all`` lets fp8 lead (half
    the weight bytes), and the tie band's simplicity counts its quantisation against it."""
    plain = json.loads(answer(capsys, BASE + ["--json"]))
    assert {(p["plan"]["weights"], p["plan"]["activations"], p["plan"]["kv_cache"]) for p in plain["plans"]} == {
        ("bf16", "bf16", "bf16")}
    every = json.loads(answer(capsys, BASE + ["--json", "--quant", "all"]))
    assert every["fastest"]["plan"]["weights"] == "fp8"
    assert every["fastest"]["output_tokens_per_s"] > plain["fastest"]["output_tokens_per_s"]


def test_the_tie_band_is_the_serving_error_band_of_the_gpus_generation(capsys):
    """H100: the throughput band of the search's regime (at most the training search's on the GPUs); the first
    listed serves at least best / (1 + band)."""
    d = json.loads(answer(capsys, BASE + ["--json"]))
    band = serving_ranking_band(regime())
    assert regime()["gpu"] == "hopper" and 0 < band < 0.5
    assert d["tie_band"] == band
    assert d["plans"][0]["output_tokens_per_s"] >= d["fastest"]["output_tokens_per_s"] / (1 + band)
    assert max(p["output_tokens_per_s"] for p in d["plans"]) <= d["fastest"]["output_tokens_per_s"]


def test_a_ttft_target_says_how_far_the_ttft_was_from_published_runs(capsys, monkeypatch):
    """The legend and the JSON quote the TTFT median and p90 |error| of the measured runs like the search's regime
    (out of source, from the packaged bands); without a TTFT target neither says anything."""
    ttft, where = serving_latency_error(regime(), "ttft")
    assert ttft["runs"] >= 20 and where
    monkeypatch.setenv("COLUMNS", "100")
    text = " ".join(answer(capsys, BASE + ["--ttft-slo", "1s", "--top", "3"]).split())
    assert f"median |error| on {ttft['runs']} " in text and f"{ttft['median']:.0%}" in text
    d = json.loads(answer(capsys, BASE + ["--ttft-slo", "1s", "--json"]))
    assert d["ttft_error"] == {"runs": ttft["runs"], "median": ttft["median"], "p90": ttft["p90"], "runs_on": where}
    assert "TTFT target" not in answer(capsys, BASE + ["--top", "3"])
    assert json.loads(answer(capsys, BASE + ["--json"]))["ttft_error"] is None


def test_quant_all_with_every_axis_fixed_is_one_line_and_exit_2(capsys):
    from bad_input_helpers import fails

    fixed = ["--tp", "8", "--pp", "1", "--dpa", "1", "--ep", "1", "--batch", "64", "--replicas", "1",
             "--prefill-replicas", "0"]
    assert "quant" in fails(BASE + fixed + ["--quant", "all"], capsys)
