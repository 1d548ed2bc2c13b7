"""The iteration-level simulation of one instance (Orca's iteration-level scheduling, Yu et al. 2022, §4.2; vLLM
V1's scheduler, vllm/v1/core/sched/scheduler.py): each iteration, the running sequences' decodes first, then the
prompt chunks of the sequences being prefilled, then new requests first come first served while the token budget,
``max_seqs`` and the KV cache allow; the iteration's time is serve's price at its decodes, prompt tokens and mean
context (prices.py); the clock moves by it.

- chunked prefill (scheduler.chunked): decodes and prompt chunks share an iteration's ``budget`` tokens; a prompt's
  last chunk samples its first token. Separate: whole prompts in iterations of their own, decodes waiting.
- KV cache: on demand, a sequence holds its tokens' pages (half a page of rounding each on average); when the next
  decode does not fit, the newest running sequence is preempted, its pages freed, and it waits at the head of the
  queue to prefill its prompt and its tokens so far again (vLLM's PreemptionMode.RECOMPUTE). Reserved in full
  (scheduler.reserve_full), a sequence is admitted only when its prompt and whole output fit, and never preempted.
- prefix cache: a share of each prompt is found cached (scheduler.cached) and not computed.
- a request whose prompt and output alone exceed the KV cache is refused (vLLM rejects it at admission).

Fast: the decoding sequences are aggregates, not a loop: each holds base + (k − k0) tokens at iteration k, so their
sum is Σbase + n·k − Σk0; each finishes at a known iteration (a heap); only prompt chunks are handled one by one.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.prices import Prices
from meshplan.serve.load.scheduler import Scheduler
from meshplan.serve.load.speculation import SpeculativePrices
from meshplan.serve.load.timeline import LoadTimeline


class _Instance:
    """One instance's state (module docstring); ``run`` returns the requests' first-token and finish times."""

    def __init__(self, reqs: Requests, sched: Scheduler, price: Prices | SpeculativePrices) -> None:
        self.s, self.price = sched, price
        self.arr = [float(v) for v in reqs.arrival]
        self.inp, self.out = [int(v) for v in reqs.input_len], [int(v) for v in reqs.output_len]
        n = len(self.inp)
        self.first, self.done = [math.nan] * n, [math.nan] * n
        self.gen, self.k0, self.base, self.version = [0] * n, [0] * n, [0] * n, [0] * n
        self.state = [0] * n  # 0 waiting or not arrived, 1 prefilling, 2 decoding, 3 finished or refused
        self.waiting: deque[int] = deque()
        self.prefilling: list[list[int]] = []  # [request, tokens left to prefill, tokens held]
        self.order: list[int] = []  # running requests in admission order (finished ones dropped lazily)
        self.heap: list[tuple[int, int, int]] = []  # (last decode iteration, request, version)
        self.nd = self.sum_base = self.sum_k0 = self.held_prefill = self.running = self.committed = 0
        self.it, self.now, self.next, self.preemptions, self.refused = 0, 0.0, 0, 0, 0
        self.closed = reqs.concurrency
        self.timeline = LoadTimeline()
        self.rows = self.timeline.rows  # appended to directly in the loop (LoadTimeline.add's row)

    def used(self) -> float:
        """KV tokens held now (module docstring)."""
        decode = self.sum_base + self.s.step_tokens * (self.nd * self.it - self.sum_k0)
        return decode + self.held_prefill + self.running * self.s.block_size / 2

    def arrive(self) -> None:
        n = len(self.inp)
        if self.closed:
            while self.next < n and self.next < self.closed:
                self.arr[self.next] = 0.0
                self.waiting.append(self.next)
                self.next += 1
            return
        while self.next < n and self.arr[self.next] <= self.now:
            self.waiting.append(self.next)
            self.next += 1

    def release(self, r: int) -> None:
        """A finished or refused request; a closed loop's client sends its next one now."""
        self.state[r] = 3
        if self.closed and self.next < len(self.inp):
            self.arr[self.next] = self.now
            self.waiting.append(self.next)
            self.next += 1

    def preempt(self) -> None:
        """The newest running sequence gives back its pages and waits at the head of the queue."""
        while self.state[self.order[-1]] not in (1, 2):
            self.order.pop()
        r = self.order.pop()
        if self.state[r] == 2:
            self.gen[r] += int(self.s.step_tokens * (self.it - self.k0[r]))
            self.sum_base -= self.base[r]
            self.sum_k0 -= self.k0[r]
            self.nd -= 1
            self.version[r] += 1
        else:
            entry = next(e for e in self.prefilling if e[0] == r)
            self.held_prefill -= entry[2]
            self.prefilling.remove(entry)
        self.state[r], self.running = 0, self.running - 1
        self.committed -= self.inp[r] + self.out[r]
        self.waiting.appendleft(r)
        self.preemptions += 1

    def admit(self, tokens: int, budget: int, chunks: list) -> int:
        """New requests while the budget, max_seqs and the KV cache allow, each with its first chunk in
        ``chunks``; the iteration's prompt tokens after them."""
        s, cap = self.s, self.s.kv_tokens
        while self.waiting and self.running < s.max_seqs and tokens < budget:
            r = self.waiting[0]
            prompt = self.inp[r] + self.gen[r]
            if self.inp[r] + self.out[r] + s.block_size > cap or (not s.chunked and prompt > budget):
                self.waiting.popleft()
                self.refused += 1
                self.release(r)
                continue
            cached = s.cached(prompt) if self.gen[r] == 0 else 0
            take = min(prompt - cached, budget - tokens)
            if s.reserve_full:
                fits = self.committed + self.inp[r] + self.out[r] + s.block_size <= cap
            else:
                fits = self.used() + self.nd * s.step_tokens + cached + take + s.block_size <= cap
            if not fits or (not s.chunked and take < prompt - cached):
                break
            self.waiting.popleft()
            self.state[r], self.running = 1, self.running + 1
            self.committed += self.inp[r] + self.out[r]
            self.order.append(r)
            entry = [r, prompt - cached, cached]
            self.prefilling.append(entry)
            self.held_prefill += cached
            chunks.append((entry, take))
            tokens += take
        return tokens

    def continued(self, budget: int) -> tuple[list, int]:
        """The chunks of the sequences already being prefilled, oldest first, in the budget and the free KV."""
        chunks, tokens = [], 0
        free = self.s.kv_tokens - self.used() - self.nd * self.s.step_tokens if not self.s.reserve_full else budget
        for entry in self.prefilling:
            take = min(entry[1], budget - tokens, int(free))
            if take <= 0:
                break
            chunks.append((entry, take))
            tokens += take
            free -= take
        return chunks, tokens

    def step(self) -> bool:
        """One iteration (module docstring); False when every request is done."""
        s = self.s
        self.arrive()
        if not self.running and not self.waiting:
            if self.closed or self.next >= len(self.inp):
                return False
            self.now = max(self.now, self.arr[self.next])
            return True
        preempted = False
        while not s.reserve_full and self.nd and self.used() + self.nd * s.step_tokens > s.kv_tokens:
            self.preempt()
            preempted = True
        budget = s.budget - self.nd * (1 + s.draft_tokens) if s.chunked else s.budget
        chunks, tokens = self.continued(budget) if s.chunked else ([], 0)
        if not preempted and self.waiting and self.running < s.max_seqs:
            tokens = self.admit(tokens, budget, chunks)
        nd = self.nd if s.chunked or not chunks else 0
        if not nd and not chunks:  # prompts being prefilled fill the cache: the newest gives way
            if self.running:
                self.preempt()
            return True
        held = self.sum_base + s.step_tokens * (self.nd * self.it - self.sum_k0)
        # the chunks' mean prefix: the tokens of their prompts already cached (earlier chunks, prefix-cache hits)
        prefix = sum(take * entry[2] for entry, take in chunks) / tokens if tokens else 0.0
        dt = self.price(nd, tokens, held / self.nd if self.nd else 0.0, prefix)
        self.rows.append((self.now, dt, self.used() / s.kv_tokens, self.running, len(self.waiting)))
        self.now += dt
        if nd:
            self.finish_decodes()
        for entry, take in chunks:
            entry[1] -= take
            entry[2] += take
            self.held_prefill += take
            if not entry[1]:
                self.prefilled(entry)
        return True

    def finish_decodes(self) -> None:
        """The decodes whose last token this iteration made leave; the iteration count moves on."""
        while self.heap and self.heap[0][0] <= self.it:
            _, r, version = heapq.heappop(self.heap)
            if version != self.version[r] or self.state[r] != 2:
                continue
            self.sum_base -= self.base[r]
            self.sum_k0 -= self.k0[r]
            self.nd, self.running = self.nd - 1, self.running - 1
            self.committed -= self.inp[r] + self.out[r]
            self.done[r], self.gen[r] = self.now, self.out[r]
            self.release(r)
        self.it += 1

    def prefilled(self, entry: list[int]) -> None:
        """A prompt fully prefilled: its next token sampled; it decodes from the next iteration, or leaves."""
        r = entry[0]
        self.prefilling.remove(entry)
        self.held_prefill -= entry[2]
        self.gen[r] += 1
        if math.isnan(self.first[r]):
            self.first[r] = self.now
        if self.gen[r] >= self.out[r]:
            self.running -= 1
            self.committed -= self.inp[r] + self.out[r]
            self.done[r] = self.now
            self.release(r)
            return
        self.state[r], self.k0[r], self.base[r] = 2, self.it, self.inp[r] + self.gen[r]
        self.nd += 1
        self.sum_base += self.base[r]
        self.sum_k0 += self.it
        steps = math.ceil((self.out[r] - self.gen[r]) / self.s.step_tokens - 1e-9)
        heapq.heappush(self.heap, (self.it + steps - 1, r, self.version[r]))


@dataclass
class Run:
    """One instance's simulated requests: arrival, first-token and finish times, lengths; its KV timeline."""

    arrival: np.ndarray
    first: np.ndarray
    done: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    preemptions: int
    refused: int
    timeline: LoadTimeline
    held_s: float | None = None  # request-seconds in the system, where no one timeline holds them (disagg.py)


def simulate_instance(reqs: Requests, sched: Scheduler, price: Prices | SpeculativePrices) -> Run:
    """Every request of ``reqs`` through one instance (module docstring)."""
    sim = _Instance(reqs, sched, price)
    while sim.step():
        pass
    arrival, first, done = (np.asarray(v, dtype=float) for v in (sim.arr, sim.first, sim.done))
    return Run(arrival, first, done, reqs.input_len, reqs.output_len, sim.preemptions, sim.refused, sim.timeline)
