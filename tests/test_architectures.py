"""The per-architecture tables (architectures.py): the presets carry the MAMF table's figures, the rule gives them
back for an accelerator defined without them and grows continuously with the peak, and the MMA kind follows the
architecture."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.errors import SpecError
from meshplan.specs.architectures import MAMF_UNKNOWN, MATMUL, async_mma, matmul_rule
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system


@pytest.mark.parametrize(("system", "part"), [("a100", 0), ("h100", 1), ("b200", 2), ("gb200", 3), ("h100-96gb", 1)])
def test_presets_carry_the_measured_matmul_efficiency_of_the_table_and_the_rule_gives_it_back(system, part):
    acc = load_system(system).accelerator
    entry = MATMUL[part]
    assert (acc.architecture, acc.matmul_bf16, acc.matmul_fp8, acc.matmul_watts) == (
        entry.architecture, entry.bf16, entry.fp8, entry.watts)
    # a user accelerator without the measured fields gets the same MAMF from the rule (exact at a measured part)
    bare = replace(acc, matmul_bf16=0.0, matmul_fp8=0.0, matmul_watts=0.0, async_mma=None)
    for precision in {"bf16", "fp8"} & set(acc.peak_flops):
        assert DEFAULT.mamf(bare, precision) == pytest.approx(DEFAULT.mamf(acc, precision), rel=1e-12)
    assert DEFAULT.clock(bare) == 1.0  # no stated rated power: the datasheet clock
    assert DEFAULT.clock(replace(bare, matmul_watts=acc.matmul_watts)) == DEFAULT.clock(acc)


def test_matmul_rule_is_continuous_and_its_rate_grows_with_the_peak():
    """Issue 34: an A100 file without matmul_bf16 at 322 instead of 312 TFLOP/s fell to the 0.80 default (the
    lookup wanted the peak within 2 %). The rule interpolates in log(peak) between an architecture's parts."""
    a100 = replace(load_system("a100").accelerator, matmul_bf16=0.0, matmul_fp8=0.0)
    faster = replace(a100, peak_flops={**a100.peak_flops, "bf16": 322e12})
    assert DEFAULT.mamf(a100, "bf16") == 0.869 and DEFAULT.mamf(faster, "bf16") == 0.869  # one Ampere part: held
    # between the two Blackwell parts: ln-interpolated; at the midpoint in log(peak) the geometric mean
    mid = math.sqrt(2250e12 * 2500e12)
    assert matmul_rule("blackwell", mid, False) == pytest.approx(math.sqrt(0.776 * 0.729))
    # unstated architecture: every part; an architecture nobody measured: the default
    assert matmul_rule("", 989e12, False) == pytest.approx(0.803)
    assert matmul_rule("volta", 125e12, False) == MAMF_UNKNOWN
    # peak x MAMF never falls as the peak rises, for both columns, across and beyond the table
    for architecture in ("", "hopper", "blackwell", "ampere"):
        for low in (False, True):
            peaks = [10 ** (12 + i / 50) for i in range(200)]
            rates = [p * matmul_rule(architecture, p, low) for p in peaks]
            assert all(b >= a for a, b in zip(rates, rates[1:], strict=False)), (architecture, low)


def test_async_mma_follows_the_architecture_when_unstated():
    a100 = replace(load_system("a100").accelerator, async_mma=None)
    h100 = replace(load_system("h100").accelerator, async_mma=None)
    assert (async_mma(a100), async_mma(h100), async_mma(replace(h100, architecture=""))) == (False, True, True)


def test_unknown_architecture_is_one_clear_error():
    with pytest.raises(SpecError, match="architecture='hoper' is not one of"):
        replace(load_system("h100").accelerator, architecture="hoper")


@pytest.mark.parametrize(("system", "bf16", "fp8"), [("b300", 1769.0e12, 3353.3e12), ("h200", 794.5e12, 1453.4e12)])
def test_parts_measured_on_their_own_carry_their_rate_not_the_lookup_entry(system, bf16, fp8):
    """The B300 and H200 share SM count and 16-bit peak with the B200 / H100 (whose lookup entries they would
    otherwise match) but have rows of their own in the ml-engineering MAMF table: B300 1769.0 BF16 and 3353.3 FP8
    of 2250 / 4500 TFLOP/s; H200 FP8 1453.4 of 1979 (its BF16 "is the same" as the H100's 794.5)."""
    acc = load_system(system).accelerator
    assert acc.flops("bf16") * DEFAULT.mamf(acc, "bf16") == pytest.approx(bf16, rel=1e-3)
    assert acc.flops("fp8") * DEFAULT.mamf(acc, "fp8") == pytest.approx(fp8, rel=1e-3)
