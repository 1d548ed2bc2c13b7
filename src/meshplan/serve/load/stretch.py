"""A run of pure decode iterations in closed form: the simulation's fast path (simulate.py).

Between two events (a request arriving, one finishing, the KV cache filling) an instance that decodes only repeats
the same iteration, n sequences whose mean context grows by the tokens each gains per step (1, or E with speculative
decoding). Its price at n decodes is linear in the context between the price grid's context points (prices.py,
``Prices.knots``), so k iterations from context c₀ cost Σ_{j<k} (v + s·(c₀ + δj − c)) over each stretch of the axis:
k·p₀ + s·δ·k(k − 1)/2, and the count of iterations until a given time is the root of that quadratic. The result is
the per-iteration loop's (the same prices summed), without a Python step per token.
"""

from __future__ import annotations

import math
from bisect import bisect_right


def _segment(axis: list[float], x: float) -> int:
    """The axis segment ``x`` falls in, clamped to the ends (prices._where's rule)."""
    return min(max(bisect_right(axis, x) - 1, 0), len(axis) - 2)


def _steps_until(p0: float, dp: float, limit: int, need: float) -> int:
    """The fewest steps m ≤ ``limit`` with m·p0 + dp·m(m − 1)/2 ≥ ``need`` (``limit`` where none)."""
    a, b = dp / 2, p0 - dp / 2
    if abs(a) < 1e-18:
        m = math.ceil(need / b) if b > 0 else limit
    else:
        disc = b * b + 4 * a * need
        m = math.ceil((-b + math.sqrt(disc)) / (2 * a)) if disc >= 0 else limit
    m = min(max(m, 1), limit)
    while m > 1 and (m - 1) * p0 + dp * (m - 1) * (m - 2) / 2 >= need:  # the root's rounding, either way
        m -= 1
    while m < limit and m * p0 + dp * m * (m - 1) / 2 < need:
        m += 1
    return m


def stretch(knots: tuple[list[float], list[float]], context: float, growth: float, most: int,
            until: float) -> tuple[int, float, float, float, float]:
    """Iterations from mean context ``context`` (each ``growth`` more) until their time reaches ``until`` seconds
    or ``most`` of them have run: (iterations, seconds, the first one's length, the second's, the last one's)."""
    axis, values = knots
    done, elapsed, ctx = 0, 0.0, context
    start = first = last = 0.0
    while True:
        i = _segment(axis, ctx)
        slope = (values[i + 1] - values[i]) / (axis[i + 1] - axis[i])
        p0, dp = values[i] + slope * (ctx - axis[i]), slope * growth
        room = most - done
        if i < len(axis) - 2 and growth > 0:  # iterations before the context crosses the next point
            room = min(room, max(math.ceil((axis[i + 1] - ctx) / growth), 1))
        total = room * p0 + dp * room * (room - 1) / 2
        if elapsed + total >= until:
            room = _steps_until(p0, dp, room, until - elapsed)
            total = room * p0 + dp * room * (room - 1) / 2
        if not done:
            start = p0
        if done <= 1 < done + room:
            first = p0 + dp * (1 - done)
        last = p0 + dp * (room - 1)
        done, elapsed, ctx = done + room, elapsed + total, ctx + growth * room
        if done >= most or elapsed >= until:
            return done, elapsed, start, first or last, last
