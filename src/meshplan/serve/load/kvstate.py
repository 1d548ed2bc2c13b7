"""One instance's requests and KV cache under its scheduler's rules (policy.py): arrivals, admission, the prompt
chunks of an iteration, preemption and retraction. The iterations themselves are simulate.py's.

Per request: 0 waiting (or not arrived), 1 prefilling, 2 decoding, 3 finished or refused. Decoding sequences are
aggregates: one that started decoding at iteration k0 holding ``base`` tokens holds base + E·(k − k0) at iteration k,
so their sum is Σbase + E·(n·k − Σk0).
"""

from __future__ import annotations

import math
from collections import deque

from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.scheduler import Scheduler


class KVState:
    """The requests, the queue and the cache of one instance (module docstring)."""

    def __init__(self, reqs: Requests, sched: Scheduler) -> None:
        self.s = sched
        # the scheduler's sizes the loop reads at every step, as plain attributes (a frozen record's are slower)
        self.step_tokens, self.block, self.kv = sched.step_tokens, sched.block_size, sched.kv_tokens
        self.arr = [float(v) for v in reqs.arrival.tolist()]
        self.inp, self.out = _ints(reqs.input_len), _ints(reqs.output_len)
        n = len(self.inp)
        self.first, self.done, self.last_token = [math.nan] * n, [math.nan] * n, [math.nan] * n
        self.gen, self.k0, self.base, self.version = [0] * n, [0] * n, [0] * n, [0] * n
        self.state = [0] * n
        self.waiting: deque[int] = deque()
        self.prefilling: list[list[int]] = []  # [request, tokens left to prefill, tokens held]
        self.order: list[int] = []  # running requests in admission order (finished ones dropped lazily)
        self.heap: list[tuple[int, int, int]] = []  # (last decode iteration, request, version)
        self.nd = self.sum_base = self.sum_k0 = self.sum_inp = self.sum_out = 0
        self.held_prefill = self.running = self.committed = 0
        self.it, self.now, self.next, self.preemptions, self.refused = 0, 0.0, 0, 0, 0
        self.closed = reqs.concurrency
        self.ratio = sched.policy.init_new_token_ratio  # SGLang's new_token_ratio
        self._cached: dict[int, int] = {}  # sched.cached by prompt length (admit)
        # request-seconds in the system before the iteration start at which each request is first counted (it arrived
        # during the iteration before): what the timeline's per-iteration counts leave out
        self.lag = 0.0

    def decode_tokens(self) -> float:
        """KV tokens the decoding sequences hold now."""
        return self.sum_base + self.step_tokens * (self.nd * self.it - self.sum_k0)

    def used(self) -> float:
        """KV tokens held now (module docstring), with half a page of rounding per running sequence."""
        return (self.sum_base + self.step_tokens * (self.nd * self.it - self.sum_k0) + self.held_prefill
                + self.running * self.block / 2)

    def arrive(self) -> None:
        n = len(self.inp)
        if not self.closed and (self.next >= n or self.arr[self.next] > self.now):  # nothing new (most steps)
            return
        if self.closed:
            while self.next < n and self.next < self.closed:
                self.arr[self.next] = 0.0
                self.waiting.append(self.next)
                self.next += 1
            return
        arr, now, waiting, at, lag = self.arr, self.now, self.waiting, self.next, self.lag
        while at < n and arr[at] <= now:
            lag += now - arr[at]
            waiting.append(at)
            at += 1
        self.next, self.lag = at, lag

    def release(self, r: int) -> None:
        """A finished or refused request; a closed loop's client sends its next one now."""
        self.state[r] = 3
        if self.closed and self.next < len(self.inp):
            self.arr[self.next] = self.now
            self.waiting.append(self.next)
            self.next += 1

    def start_decoding(self, r: int) -> None:
        self.state[r], self.k0[r], self.base[r] = 2, self.it, self.inp[r] + self.gen[r]
        self.nd += 1
        self.sum_base += self.base[r]
        self.sum_k0 += self.it
        self.sum_inp += self.inp[r]
        self.sum_out += self.out[r]

    def leave_decoding(self, r: int) -> None:
        self.sum_base -= self.base[r]
        self.sum_k0 -= self.k0[r]
        self.sum_inp -= self.inp[r]
        self.sum_out -= self.out[r]
        self.nd -= 1
        self.version[r] += 1

    def make_room(self) -> bool:
        """Preempt (or retract) until the decodes' next tokens fit; whether any was."""
        s = self.s
        if not self.nd or s.policy.preempt == "none" or self.used() + self.nd * self.step_tokens <= self.kv:
            return False
        if s.policy.preempt == "retract":
            self.retract()
            return True
        while self.nd and self.used() + self.nd * s.step_tokens > s.kv_tokens:
            self.preempt_newest()
        return True

    def _back(self, r: int) -> None:
        """Request ``r`` gives back its pages and waits, at the queue's head or tail (the policy's ``resume``)."""
        if self.state[r] == 2:
            self.gen[r] += int(self.s.step_tokens * (self.it - self.k0[r]))
            self.last_token[r] = self.now
            self.leave_decoding(r)
        else:
            entry = next(e for e in self.prefilling if e[0] == r)
            self.held_prefill -= entry[2]
            self.prefilling.remove(entry)
        self.state[r], self.running = 0, self.running - 1
        self.committed -= self.inp[r] + self.out[r]
        if self.s.policy.resume == "head":
            self.waiting.appendleft(r)
        else:
            self.waiting.append(r)
        self.preemptions += 1

    def preempt_newest(self) -> None:
        """The newest running sequence gives back its pages (vLLM's ``self.running.pop()``)."""
        while self.state[self.order[-1]] not in (1, 2):
            self.order.pop()
        self._back(self.order.pop())

    def retract(self) -> None:
        """SGLang's retract_decode: decoding requests by (output tokens, −prompt tokens), the last retracted first,
        until the free tokens cover ``retract_decode_steps`` steps of the rest (at least one retracted, one kept);
        the new-token ratio becomes (decoded + steps · kept) / their outputs, at most 1."""
        s, p = self.s, self.s.policy
        live = [r for r in self.order if self.state[r] == 2]
        made = {r: self.gen[r] + int(s.step_tokens * (self.it - self.k0[r])) for r in live}
        live.sort(key=lambda r: (made[r], -self.inp[r]), reverse=True)
        while len(live) > 1:
            self._back(live.pop())
            if s.kv_tokens - self.used() >= p.retract_decode_steps * len(live) * s.step_tokens:
                break
        decoded = sum(made[r] for r in live)
        self.ratio = min(1.0, (decoded + p.retract_decode_steps * len(live)) / max(sum(self.out[r] for r in live), 1))

    def continued(self, budget: int) -> tuple[list, int]:
        """The chunks of the prompts being prefilled, oldest first, in the budget and the free KV."""
        chunks: list = []
        tokens = 0
        if not self.prefilling:
            return chunks, tokens
        reserve = self.s.policy.admission == "reserve"
        free = budget if reserve else self.kv - self.used() - self.nd * self.step_tokens
        for entry in self.prefilling:
            take = min(entry[1], budget - tokens, int(free))
            if take <= 0:
                break
            chunks.append((entry, take))
            tokens += take
            free -= take
        return chunks, tokens

    def _fits(self, r: int, cached: int, take: int, fresh: int) -> bool:
        """Whether request ``r`` may enter now with ``take`` of its ``fresh`` prompt tokens past ``cached`` ones."""
        s, p = self.s, self.s.policy
        if p.admission == "reserve":
            return self.committed + self.inp[r] + self.out[r] + s.block_size <= s.kv_tokens
        need = self.used() + self.nd * s.step_tokens + cached + take + s.block_size
        if p.admission == "on_demand":
            return need <= s.kv_tokens * (1 - p.watermark)
        # SGLang's PrefillAdder: its prompt and output (clipped at clip_max_new_tokens) below the free tokens less the
        # running requests' remaining outputs at the ratio, less the prompts and outputs of those being prefilled
        made = self.sum_base - self.sum_inp + s.step_tokens * (self.nd * self.it - self.sum_k0)
        owed = (self.sum_out - made) * self.ratio + sum(e[1] + self.out[e[0]] for e in self.prefilling)
        return self.used() + owed + fresh + min(self.out[r], p.clip_max_new_tokens) < s.kv_tokens

    def admit(self, tokens: int, budget: int, chunks: list) -> int:
        """New requests first come first served while the budget, max_seqs and the cache allow, each with its first
        chunk in ``chunks``; the iteration's prompt tokens after them."""
        s = self.s
        if not self.waiting or self.running >= s.max_seqs or tokens >= budget:  # nothing to admit (most steps)
            return tokens
        p, waiting, inp, out, gen, memo = s.policy, self.waiting, self.inp, self.out, self.gen, self._cached
        limit, chunked, max_seqs = p.max_prefill_tokens or budget, p.chunked, s.max_seqs
        # on demand (most engines): _fits's test written out, the room its watermark leaves computed once, and the
        # decodes' tokens (self.used()'s first terms) and next tokens, which no admission moves
        room = s.kv_tokens * (1 - p.watermark) if p.admission == "on_demand" else None
        decoding = self.sum_base + self.step_tokens * (self.nd * self.it - self.sum_k0)
        next_tokens = self.nd * self.step_tokens
        block, kv, last_decoded = self.block, self.kv, s.last_token_decoded
        while waiting and self.running < max_seqs and tokens < budget:
            r = waiting[0]
            made = gen[r]
            prompt = inp[r] + made
            if made == 0:
                cached = memo.get(prompt)
                if cached is None:
                    cached = memo[prompt] = s.cached(prompt)
            else:
                cached = 0
            if last_decoded and not made:
                prompt -= 1  # the context step leaves the last prompt token to the next decode
            fresh = prompt - cached
            whole = inp[r] + out[r]
            if whole + block > kv or (not chunked and fresh > s.budget):
                waiting.popleft()
                self.refused += 1
                self.release(r)
                continue
            take = min(fresh, budget - tokens)
            if (not chunked and take < fresh) or (tokens and tokens + take > limit):
                break
            if room is not None:
                if not (decoding + self.held_prefill + self.running * block / 2 + next_tokens + cached + take
                        + block <= room):  # self.used() + … as _fits adds them
                    break
            elif not self._fits(r, cached, take, fresh):
                break
            waiting.popleft()
            self.state[r], self.running = 1, self.running + 1
            self.committed += whole
            self.order.append(r)
            entry = [r, fresh, cached]
            self.prefilling.append(entry)
            self.held_prefill += cached
            chunks.append((entry, take))
            tokens += take
        return tokens


def _ints(values) -> list[int]:
    """``[int(v) for v in values]`` (an integer array's own list where it is one)."""
    return values.tolist() if values.dtype.kind in "iu" else [int(v) for v in values]
