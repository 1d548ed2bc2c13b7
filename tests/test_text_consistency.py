"""What the text says agrees with itself: the legend's error band is the rows' (it said ±7 % beside ±9 % rows), a
rejection prints digits enough to show why ("72.5 GiB > 72.5 GiB"), a token budget without a unit is not taken for
15 tokens, and ``estimate``'s "fits" is the rule ``plan`` applies (fields.MEMORY_HEADROOM)."""

from __future__ import annotations

import re

import pytest

from bad_input_helpers import fails
from meshplan.cli import main
from meshplan.fields import MEMORY_HEADROOM, usable_hbm
from meshplan.units import GiB, MiB, fmt_over


@pytest.mark.parametrize("system", ["h100", "a100", "b200"])
def test_the_legend_band_is_the_rows_band(system, capsys):
    assert main(["plan", "--model", "llama3-8b", "--system", system, "--gpus", "16", "--top", "4"]) == 0
    out = capsys.readouterr().out
    rows = set(re.findall(r" s (±\d+%) │", out))
    legend = re.findall(r"(±\d+%): the step time's error band", re.sub(r"\s+", " ", out))  # wrapped, padded lines
    assert len(rows) == 1 and legend == [rows.pop()], (rows, legend)


def test_a_rejection_shows_why():
    """Used above the limit always prints two different numbers, whatever the gap (1 B to 10 GiB)."""
    for limit in (72.5 * GiB, 79.6 * GiB, 500 * MiB, 1.5 * 2**40):
        for gap in (1.0, 1e3, 1e5, 5e6, 5e7, 1e10):
            text = fmt_over(limit + gap, limit)
            used, cap = re.findall(r"([\d.]+) \w+", text)[:2]
            assert used != cap or "(by " in text, text
    assert fmt_over(72.53 * GiB, 72.5 * GiB) == "72.53 GiB > 72.50 GiB"
    assert fmt_over(80.1 * GiB, 72.5 * GiB) == "80.1 GiB > 72.5 GiB"


def test_a_token_budget_needs_a_unit(capsys):
    err = fails(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tokens", "15"], capsys)
    assert err.endswith("tokens='15' would be 15 tokens: give a unit ('15T' = 15 trillion, '15B' = billion) or the "
                        "whole count (at least 1e+06)")


@pytest.mark.parametrize(("micro", "within"), [("1", False), ("2", True)])
def test_estimate_fits_by_plans_rule(micro, within, capsys):
    """llama3-8b at 9,216 tokens a sequence, full recompute, ZeRO-1 on 8 H100 (79.6 GiB): micro-batch 1 is 65.1 GiB
    ≤ 79.6 · 0.91 = 72.4 GiB (fits), 2 is 74.1 GiB (in HBM, inside the headroom: plan rejects it, and estimate says
    so)."""
    import json

    from meshplan.specs.hardware import load_system

    args = ["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--dp", "8", "--zero", "1",
            "--recompute", "full", "--micro-batch", micro, "--seq", "9216"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    usable = usable_hbm(load_system("h100").accelerator.hbm_bytes, MEMORY_HEADROOM)
    assert (data["peak_memory_bytes"] > usable) == within
    assert data["fits"] and data["fits_headroom"] == (not within)
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("(fits)" in out) == (not within) and ("plan rejects it" in out) == within
