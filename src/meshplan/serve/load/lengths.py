"""Request lengths: how many prompt and output tokens each simulated request has.

- ``fixed``: every request I and O tokens (vLLM benchmark_serving's ``random`` dataset at range ratio 0).
- ``uniform``: I and O drawn uniformly from [(1 − r)·x, (1 + r)·x] (vLLM's ``--random-range-ratio r``,
  benchmarks/benchmark_dataset.py RandomDataset).
- ``sglang-random``: SGLang bench_serving's ``random`` dataset, I from [max(⌊r·I⌋, 1), I] and O from [⌊r·O⌋, O]
  (``--random-range-ratio r``, default 0: sglang v0.4.6 python/sglang/bench_serving.py sample_random_requests;
  an output of 0 tokens is taken as 1).
- ``synthetic``: GenAI-Perf's synthetic prompts, I and O from normals of means I and O and standard deviations
  ``--synthetic-input-tokens-stddev`` / ``--output-tokens-stddev``, truncated at 0 by rejection and rounded up
  (its sample_positive_normal_integer, kept as is in its successor AIPerf).
- ``empirical``: (input, output) pairs from a file (CSV with ``input_len`` / ``output_len`` columns, or JSONL with
  those keys), drawn with replacement.
- a public dataset by name (``DATASETS``): lengths drawn from a log-normal with the dataset's published mean and an
  assumed spread (``SPREAD``), filtered as vLLM's benchmark filters ShareGPT (each side at least 4 tokens, the prompt
  at most 1,024, prompt and output at most 2,048: benchmark_dataset.is_valid_sequence); ``sharegpt-sglang`` filtered
  as SGLang's bench_serving filters it (each side at least 2 tokens, no upper limit without ``--sharegpt-context-len``:
  sglang v0.4.6 bench_serving.py sample_sharegpt_requests).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshplan.errors import SpecError
from meshplan.files import read_text

# Published mean prompt and output tokens: Kwon et al. 2023, "Efficient Memory Management for Large Language Model
# Serving with PagedAttention", §6.1 and Fig. 11 (ShareGPT 161.31 / 337.99 tokens, "8.4x longer input prompts and
# 5.8x longer outputs" than Alpaca's 19.31 / 58.45).
DATASETS: dict[str, tuple[float, float, str]] = {
    "sharegpt": (161.31, 337.99, "Kwon et al. 2023 (vLLM), §6.1, Fig. 11"),
    "alpaca": (19.31, 58.45, "Kwon et al. 2023 (vLLM), §6.1, Fig. 11"),
}
# The log-normal's sigma: an assumption (a coefficient of variation about 1.1, the long tail of chat lengths in
# Fig. 11's histograms); the papers publish the histograms, not a spread
SPREAD = 0.9
MIN_LEN, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048  # vLLM benchmark_dataset.is_valid_sequence's ShareGPT filter
SGLANG_MIN_LEN = 2  # SGLang bench_serving's ShareGPT filter: "if prompt_len < 2 or output_len < 2"
LENGTH_KINDS = ("fixed", "uniform", "sglang-random", "synthetic", "empirical", *DATASETS, "sharegpt-sglang")


@dataclass(frozen=True)
class Lengths:
    """A length distribution: ``kind`` (module docstring), the fixed or centre lengths, the uniform range ratio,
    and the empirical pairs."""

    kind: str
    input_len: int = 0
    output_len: int = 0
    ratio: float = 0.0
    pairs: tuple[tuple[int, int], ...] = ()
    stddev: tuple[float, float] = (0.0, 0.0)  # ``synthetic``'s standard deviations of I and O

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` requests' prompt and output tokens (integer arrays)."""
        if self.kind == "fixed":
            return np.full(n, self.input_len), np.full(n, self.output_len)
        if self.kind == "uniform":
            return (_uniform(self.input_len, self.ratio, n, rng), _uniform(self.output_len, self.ratio, n, rng))
        if self.kind == "sglang-random":
            low_in, low_out = max(int(self.input_len * self.ratio), 1), int(self.output_len * self.ratio)
            return (rng.integers(low_in, self.input_len + 1, n),
                    np.maximum(rng.integers(low_out, self.output_len + 1, n), 1))
        if self.kind == "synthetic":
            return (_normal(self.input_len, self.stddev[0], n, rng), _normal(self.output_len, self.stddev[1], n, rng))
        if self.kind == "sharegpt-sglang":
            return _dataset("sharegpt", n, rng, sglang=True)
        if self.kind == "empirical":
            picked = np.asarray(self.pairs)[rng.integers(0, len(self.pairs), n)]
            return picked[:, 0].copy(), picked[:, 1].copy()
        return _dataset(self.kind, n, rng)

    @property
    def mean(self) -> tuple[float, float]:
        """Mean prompt and output tokens (the dataset's published means before the filter)."""
        if self.kind == "empirical":
            pairs = np.asarray(self.pairs, dtype=float)
            return float(pairs[:, 0].mean()), float(pairs[:, 1].mean())
        if self.kind in DATASETS:
            return DATASETS[self.kind][:2]
        if self.kind == "sharegpt-sglang":
            return DATASETS["sharegpt"][:2]
        return float(self.input_len), float(self.output_len)


def _uniform(centre: int, ratio: float, n: int, rng: np.random.Generator) -> np.ndarray:
    low, high = max(int(centre * (1 - ratio)), 1), max(int(centre * (1 + ratio)), 1)
    return rng.integers(low, high + 1, n)


def _normal(mean: int, stddev: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """GenAI-Perf's positive normal integers (module docstring): redrawn while negative, then rounded up, at least 1."""
    if stddev <= 0:
        return np.full(n, max(mean, 1))
    x = rng.normal(mean, stddev, n)
    while np.any(x < 0):
        bad = x < 0
        x[bad] = rng.normal(mean, stddev, int(bad.sum()))
    return np.maximum(np.ceil(x), 1).astype(np.int64)


def _lognormal(mean: float, n: int, rng: np.random.Generator) -> np.ndarray:
    mu = np.log(mean) - SPREAD**2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
    return np.maximum(np.rint(rng.lognormal(mu, SPREAD, n)), 1).astype(np.int64)


def _dataset(name: str, n: int, rng: np.random.Generator, sglang: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs from the dataset's log-normals that pass vLLM's filter, or SGLang's (drawn until enough pass)."""
    mean_in, mean_out, _ = DATASETS[name]
    inp, out = np.empty(0, np.int64), np.empty(0, np.int64)
    while len(inp) < n:
        a, b = _lognormal(mean_in, 2 * n, rng), _lognormal(mean_out, 2 * n, rng)
        if sglang:
            ok = (a >= SGLANG_MIN_LEN) & (b >= SGLANG_MIN_LEN)
        else:
            ok = (a >= MIN_LEN) & (b >= MIN_LEN) & (a <= MAX_PROMPT) & (a + b <= MAX_TOTAL)
        inp, out = np.concatenate([inp, a[ok]]), np.concatenate([out, b[ok]])
    return inp[:n], out[:n]


def parse_lengths(text: str, input_len: int, output_len: int) -> Lengths:
    """``--lengths``: fixed, uniform[:r] (r from 0 to 1, default 0.5), sglang-random[:r] (default 0),
    synthetic:SD[:SD_OUT] (standard deviations in tokens; the output's default 0), a dataset's name, or a CSV / JSONL
    file."""
    word, _, arg = text.partition(":")
    if word == "fixed" and not arg:
        return Lengths("fixed", input_len, output_len)
    if word == "sglang-random":
        return Lengths("sglang-random", input_len, output_len, _ratio(text, arg, 0.0, closed=True))
    if word == "synthetic" and arg:
        return Lengths("synthetic", input_len, output_len, stddev=_spreads(text, arg))
    if word == "sharegpt-sglang" and not arg:
        return Lengths(word)
    if word == "uniform":
        return Lengths("uniform", input_len, output_len, _ratio(text, arg, 0.5))
    if word in DATASETS and not arg:
        return Lengths(word)
    if Path(text).suffix.lower() in (".csv", ".jsonl", ".json"):
        return Lengths("empirical", pairs=tuple(zip(*read_columns(text, "lengths", ("input_len", "output_len")),
                                                    strict=True)))
    raise SpecError(f"lengths={text!r} must be fixed, uniform[:ratio], sglang-random[:ratio], synthetic:SD[:SD_OUT], "
                    f"{', '.join(DATASETS)}, sharegpt-sglang, or a .csv / .jsonl file of input_len, output_len")


def _ratio(text: str, arg: str, default: float, closed: bool = False) -> float:
    """A range ratio from 0 to below 1 (to 1 when ``closed``)."""
    try:
        ratio = float(arg) if arg else default
    except ValueError:
        ratio = -1.0
    if not (0 <= ratio <= 1 if closed else 0 <= ratio < 1):
        raise SpecError(f"lengths={text!r}: the range ratio must be a number from 0 to {'1' if closed else 'below 1'}")
    return ratio


def _spreads(text: str, arg: str) -> tuple[float, float]:
    """``synthetic``'s standard deviations: SD[:SD_OUT], finite and at least 0."""
    parts = arg.split(":")
    try:
        values = [float(v) for v in parts]
    except ValueError:
        values = [-1.0]
    if len(values) > 2 or not all(0 <= v < 1e7 for v in values):
        raise SpecError(f"lengths={text!r}: synthetic:SD[:SD_OUT] takes one or two standard deviations in tokens, "
                        "from 0 to 1e7")
    return values[0], values[1] if len(values) == 2 else 0.0


def read_columns(path: str, field: str, names: tuple[str, ...]) -> tuple[tuple, ...]:
    """Columns ``names`` of a CSV (a header row) or JSONL (one object a line) file, as tuples of numbers; the
    length columns whole and positive, every value finite and at least 0."""
    text = read_text(path, field)
    if Path(path).suffix.lower() == ".csv":
        import csv  # noqa: PLC0415  (a CSV file's reader: not every load's start-up)

        rows = list(csv.DictReader(io.StringIO(text)))
    else:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise SpecError(f"{field}={path!r}: line {exc.lineno}: not JSON ({exc.msg})") from None
    if not rows:
        raise SpecError(f"{field}={path!r}: no rows")
    out = []
    for name in names:
        try:
            values = tuple(float(r[name]) for r in rows)
        except (KeyError, TypeError, ValueError):
            raise SpecError(f"{field}={path!r}: every row needs a number {name!r} (columns: "
                            f"{', '.join(names)})") from None
        whole = name.endswith("_len")
        if any(not np.isfinite(v) or v < whole or (whole and v != int(v)) for v in values):
            raise SpecError(f"{field}={path!r}: {name} must be {'whole numbers >= 1' if whole else 'finite >= 0'}")
        out.append(tuple(int(v) for v in values) if whole else values)
    return tuple(out)
