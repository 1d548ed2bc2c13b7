"""The iteration-level simulation of one instance (Orca's iteration-level scheduling, Yu et al. 2022, §4.2) under its
engine's scheduler (policy.py, read in each engine's source): each iteration the scheduler picks what runs, serve's
price of it (prices.py: its decodes, prompt tokens and mean context) moves the clock, and the requests advance.

- What an iteration carries: a mixed scheduler (vLLM V1, TensorRT-LLM) runs the decodes, then the chunks of prompts
  being prefilled, then new prompts first come first served, in one token budget; a prefill-first one (vLLM V0,
  SGLang, TurboMind) runs an iteration of prompts alone whenever it can admit or continue one, the decodes waiting,
  and the decodes alone otherwise. A chunked scheduler cuts a prompt to the budget left; else a prompt waits for an
  iteration it fits whole.
- Admission: on demand (a prompt's first chunk and the decodes' next tokens fit beside a watermark), reserved (its
  prompt and whole output fit beside every running request's), or SGLang's new-token ratio (the running requests'
  remaining outputs counted at the ratio, which decays each decode step).
- KV cache: a sequence holds its tokens' pages (half a page of rounding each on average); when the next decode does
  not fit, the newest running sequence is preempted (vLLM, recomputed from the queue's head) or SGLang retracts the
  fewest-output ones to the queue's tail and raises the ratio; its prompt and tokens so far are prefilled again.
- TurboMind decodes each prompt's last token with the batch: its first token comes from the next decode step.
- A request whose prompt and output alone exceed the KV cache, or an unchunked prompt beyond the budget, is refused.

Fast: decoding sequences are aggregates (each holds base + E·(k − k0) tokens at iteration k; each finishes at a known
iteration, a heap), and a run of pure decode iterations between two events is summed in closed form (stretch.py).
Each iteration's inter-token gaps are kept, weighted by the sequences that waited them (summary.py's ITL).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.kvstate import KVState
from meshplan.serve.load.prices import Prices
from meshplan.serve.load.scheduler import Scheduler
from meshplan.serve.load.speculation import SpeculativePrices
from meshplan.serve.load.stretch import stretch
from meshplan.serve.load.timeline import LoadTimeline


class _Instance(KVState):
    """One instance's iterations (module docstring); KVState holds the requests and the cache."""

    def __init__(self, reqs: Requests, sched: Scheduler, price: Prices | SpeculativePrices) -> None:
        super().__init__(reqs, sched)
        self.price = price
        self.timeline = LoadTimeline()
        self.rows = self.timeline.rows  # appended to directly in the loop (LoadTimeline.add's row)
        self.gaps: list[tuple[float, float, int, float]] = []  # (first, last, count, weight) inter-token gaps
        self.last_decode = math.nan  # the end of the last iteration that decoded
        self.joined: list[float] = []  # when each sequence that joined the decodes since then got its last token
        self.pending_first: list[int] = []  # sequences whose first token the next decode samples (TurboMind)
        self.peak = 0.0
        self.longest = 0.0  # the longest single iteration (the simulation's granularity: tests' slack)
        self.prefilled_last = False  # the last iteration carried prompts only (Policy.alternate)
        # the policy's choices the loop reads at every step, as plain attributes
        self.count, self.mixed = len(self.inp), sched.policy.mixed
        self.reserve, self.ratio_rule = sched.policy.admission == "reserve", sched.policy.admission == "new_token_ratio"

    def step(self) -> bool:
        """One iteration, or a run of pure decode ones (module docstring); False when every request is done."""
        s = self.s
        if self.closed or (self.next < self.count and self.arr[self.next] <= self.now):
            self.arrive()
        if not self.running and not self.waiting:
            if self.closed or self.next >= self.count:
                return False
            self.now = max(self.now, self.arr[self.next])
            self.ratio = s.policy.init_new_token_ratio
            return True
        preempted = False
        if self.mixed:
            # make_room's, continued's and admit's own tests of whether they have anything to do, first (most steps)
            if self.nd and (self.sum_base + self.step_tokens * (self.nd * self.it - self.sum_k0) + self.held_prefill
                            + self.running * self.block / 2 + self.nd * self.step_tokens > self.kv):
                preempted = self.make_room()
            budget = s.budget - self.nd * (1 + s.draft_tokens)
            chunks, tokens = self.continued(budget) if self.prefilling else ([], 0)
            if not preempted and self.waiting:
                tokens = self.admit(tokens, budget, chunks)
            nd = self.nd
        else:
            chunks, tokens = [], 0
            if not (s.policy.alternate and self.prefilled_last and self.nd):
                chunks, tokens = self.continued(s.budget)
                tokens = self.admit(tokens, s.budget, chunks)
            self.prefilled_last = bool(chunks)
            if not chunks:
                preempted = self.make_room()
            nd = 0 if chunks else self.nd
        if not nd and not chunks:  # prompts being prefilled fill the cache: the newest gives way
            if self.running:
                self.preempt_newest()
            return True
        if nd and not chunks and not preempted and not self.prefilling and self.can_stretch():
            self.decode_run()
            return True
        self.iteration(nd, chunks, tokens)
        return True

    def can_stretch(self) -> bool:
        """A run of pure decode iterations can be summed: nothing but a finish, an arrival or a full cache changes
        what the next ones carry (no prompt in progress, the queue empty or blocked until a finish)."""
        return (not self.prefilling and not self.pending_first
                and (not self.waiting or self.s.policy.admission != "new_token_ratio"))

    def iteration(self, nd: int, chunks: list, tokens: int) -> None:
        """One iteration of ``nd`` decodes and the prompt ``chunks`` (``tokens`` in all)."""
        held = self.sum_base + self.step_tokens * (self.nd * self.it - self.sum_k0)  # self.decode_tokens()
        # the chunks' mean prefix: the tokens of their prompts already cached (earlier chunks, prefix-cache hits)
        if not tokens:
            prefix = 0.0
        elif len(chunks) == 1:  # (whole numbers: the sum of one is its term)
            prefix = chunks[0][1] * chunks[0][0][2] / tokens
        else:
            prefix = sum(take * entry[2] for entry, take in chunks) / tokens
        dt = self.price(nd, tokens, held / self.nd if self.nd else 0.0, prefix)
        if dt > self.longest:
            self.longest = dt
        used = held + self.held_prefill + self.running * self.block / 2  # self.used(), before and after the clock
        self.rows.append((self.now, dt, used / self.kv, self.running, len(self.waiting)))
        self.now += dt
        peak = (used + nd * self.step_tokens + tokens) / self.kv
        if peak > self.peak:  # max(self.peak, peak)
            self.peak = peak
        if nd:
            self.decoded(dt)
            self.finish_decodes(1)
        for entry, take in chunks:
            entry[1] -= take
            entry[2] += take
            self.held_prefill += take
            if not entry[1]:
                self.prefilled(entry)

    def decoded(self, dt: float) -> None:
        """The gaps of the decode iteration that just ended: the sequences that decoded in the last one waited since
        its end, those that joined since their last token; TurboMind's newcomers get their first token."""
        now, joined, pending, last = self.now, self.joined, self.pending_first, self.last_decode
        new = len(joined) + len(pending)
        if self.nd > new and last == last:  # not NaN
            self.gaps.append((now - last, 0.0, 1, float(self.nd - new)))
        if joined:
            self.gaps.extend([(now - t, 0.0, 1, 1.0) for t in joined])
            joined.clear()
        if pending:
            for r in pending:
                self.first[r] = now
            pending.clear()
        self.last_decode = now
        if self.ratio_rule:
            p = self.s.policy
            self.ratio = max(self.ratio - p.new_token_ratio_decay, p.min_new_token_ratio)

    def decode_run(self) -> None:
        """Pure decode iterations until the next finish, arrival or full cache (stretch.py)."""
        s, nd, step, kv = self.s, self.nd, self.step_tokens, self.kv
        held = self.sum_base + step * (nd * self.it - self.sum_k0)  # self.decode_tokens()
        used = held + self.held_prefill + self.running * self.block / 2  # self.used(); decoded() below moves none
        most = self.heap[0][0] - self.it + 1 if self.heap else 1
        if not self.reserve:
            room = int((kv - used) // (nd * step))
            room = room if room > 1 else 1
            most = most if most < room else room  # min(most, max(room, 1))
        until = self.arr[self.next] - self.now if not self.closed and self.next < self.count else math.inf
        count, elapsed, first_dt, second, last = stretch(self.price.knots(nd), held / nd, step,
                                                         most if most > 1 else 1, until if until > 1e-15 else 1e-15)
        self.rows.append((self.now, elapsed, used / kv, self.running, len(self.waiting)))
        longest = self.longest  # max(self.longest, first_dt, last)
        if first_dt > longest:
            longest = first_dt
        if last > longest:
            longest = last
        self.longest = longest
        start = self.now
        self.now = start + first_dt
        self.decoded(first_dt)
        self.now = start + elapsed
        self.last_decode = self.now
        if count > 1:
            self.gaps.append((second, last, count - 1, float(nd)))
        peak = (used + nd * step * count) / kv
        if peak > self.peak:  # max(self.peak, peak)
            self.peak = peak
        if self.ratio_rule:
            self.ratio = max(self.ratio - (count - 1) * s.policy.new_token_ratio_decay, s.policy.min_new_token_ratio)
        self.finish_decodes(count)

    def finish_decodes(self, count: int) -> None:
        """``count`` decode iterations ran: those whose last token they made leave; the iteration count moves on."""
        last, heap = self.it + count - 1, self.heap
        while heap and heap[0][0] <= last:
            _, r, version = heapq.heappop(heap)
            if version != self.version[r] or self.state[r] != 2:
                continue
            self.leave_decoding(r)
            self.running -= 1
            self.committed -= self.inp[r] + self.out[r]
            self.done[r], self.gen[r] = self.now, self.out[r]
            self.release(r)
        self.it += count

    def prefilled(self, entry: list[int]) -> None:
        """A prompt fully prefilled: its next token sampled (TurboMind: by the next decode step); it decodes from the
        next iteration, or leaves."""
        r, now, gen = entry[0], self.now, self.gen
        self.prefilling.remove(entry)
        self.held_prefill -= entry[2]
        if self.s.last_token_decoded and not gen[r]:
            self.pending_first.append(r)
        else:
            gen[r] += 1
            first = self.first[r]
            if first != first:  # NaN: its first token
                self.first[r] = now
            elif self.last_token[r] == self.last_token[r]:  # a recomputed sequence's token after its wait
                self.gaps.append((now - self.last_token[r], 0.0, 1, 1.0))
            self.joined.append(now)
        out = self.out[r]
        if gen[r] >= out:
            self.running -= 1
            self.committed -= self.inp[r] + out
            self.done[r] = now
            self.release(r)
            if self.joined and self.joined[-1] == now:
                self.joined.pop()
            return
        self.start_decoding(r)
        steps = math.ceil((out - gen[r]) / self.step_tokens - 1e-9)
        heapq.heappush(self.heap, (self.it + steps - 1, r, self.version[r]))


@dataclass
class Run:
    """One instance's simulated requests: arrival, first-token and finish times, lengths; its KV timeline; the
    inter-token gaps (first, last, count, weight: ``count`` gaps spaced evenly from first to last, each waited by
    ``weight`` sequences)."""

    arrival: np.ndarray
    first: np.ndarray
    done: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    preemptions: int
    refused: int
    timeline: LoadTimeline
    held_s: float | None = None  # request-seconds in the system, where no one timeline holds them (disagg.py)
    gaps: list[tuple[float, float, int, float]] = field(default_factory=list)
    kv_peak: float = 0.0
    longest: float = 0.0  # the longest single iteration (s)
    lag: float = 0.0  # request-seconds before each request's first iteration start (KVState.lag)


def simulate_instance(reqs: Requests, sched: Scheduler, price: Prices | SpeculativePrices) -> Run:
    """Every request of ``reqs`` through one instance (module docstring)."""
    sim = _Instance(reqs, sched, price)
    while sim.step():
        pass
    arrival, first, done = (np.asarray(v, dtype=float) for v in (sim.arr, sim.first, sim.done))
    return Run(arrival, first, done, reqs.input_len, reqs.output_len, sim.preemptions, sim.refused, sim.timeline,
               gaps=sim.gaps, kv_peak=sim.peak, longest=sim.longest, lag=sim.lag)
