"""The registry of fitted constants (meshplan_validation/fitted.py): every constant set so that validation runs read
right, where it lives, on which runs of which sources; the README's count is the registry's, and the
leave-one-source-out file (docs/out_of_source.json, benchmarks/docs/out_of_source.py) refits each of them."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from meshplan_validation.fitted import FITTED, by_name
from meshplan_validation.provenance import SOURCES

ROOT = Path(__file__).resolve().parents[1]
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
         "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
         "sixteen": 16}


def test_each_constant_reads_its_value_where_it_lives_and_names_known_sources():
    keys = {s.key for s in SOURCES}
    for f in FITTED:
        assert math.isfinite(f.value()), f.name
        assert f.sources and f.sources <= keys, (f.name, sorted(f.sources - keys))
        assert Path(ROOT / f.where.split()[0]).exists(), f.where
        assert (ROOT / f.script.split()[0]).exists(), f.script
    assert by_name("gemm").value() == 0.8597  # specs/efficiency.py Efficiency.gemm
    assert len({f.name for f in FITTED}) == len(FITTED)


def test_the_readme_counts_the_registry():
    text = (ROOT / "README.md").read_text()
    found = re.search(r"(\w+)\s+constants\s+are\s+fitted", text)
    assert found, "the README says how many constants are fitted"
    said = found.group(1).lower()
    assert WORDS.get(said, int(said) if said.isdigit() else -1) == len(FITTED)


def test_the_out_of_source_file_refits_the_registry_as_it_is():
    data = json.loads((ROOT / "docs" / "out_of_source.json").read_text())
    assert [(r["name"], r["value"]) for r in data["registry"]] == [(f.name, f.value()) for f in FITTED]
    training = data["refitted"]["training"]
    # the linearised refit on every source lands near the shipped fit (refit.py's one Gauss-Newton step; what is left
    # is the drift of the physics since benchmarks/measure/fit_efficiency.py last ran, which docs/ACCURACY.md's registry
    # shows)
    assert abs(training["all sources"]["gemm"] / by_name("gemm").value() - 1) < 0.02
    assert abs(training["all sources"]["attention"] / by_name("attention").value() - 1) < 0.02
