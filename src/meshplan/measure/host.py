"""The host's own work in an eager training step, beyond each op's dispatch and kernel (which replay measures):
autograd recording each forward op, the autograd engine running each backward node, and ``nn.Module.__call__``.

Measured by microbenchmarks on a one-element tensor, whose kernels cost next to nothing (the method of
PyTorch's own dispatcher-overhead benchmarks, e.g. pytorch/benchmarks/overhead/ and the "eager overhead" of
torch.compile's design notes: time a long chain of tiny ops):

    python_op  = t(chain of N ``x * c`` without grad) / N            one op called from Python
    autograd   = t(the same chain with requires_grad) / N − python_op  recording the op's backward node
    engine     = t(backward of that chain) / N − dispatch              running one node (its kernel excluded)
    module     = t(N calls of an identity nn.Module) / N − t(N calls of its forward) / N
    dispatch   = t(N ``torch.ops.aten.mul.Tensor`` calls) / N         what replay pays per call

Measured on this project's CPU host (one thread): python_op 1.9 µs, autograd 0.6 µs, engine 3.0 − 1.0 µs,
module 0.6 µs (benchmarks/docs/measured.py prints each run's figures).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshplan.measure.timing import Clock, median

CHAIN = 400


@dataclass(frozen=True, kw_only=True)
class HostCosts:
    """Seconds of host work per forward op (autograd), per backward node (engine) and per module call."""

    python_op: float = 0.0
    autograd: float = 0.0
    engine: float = 0.0
    module: float = 0.0
    dispatch: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _median_time(fn, clock: Clock, repeats: int) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        start = clock.now()
        fn()
        runs.append(clock.now() - start)
    return median(runs)


def measure_host(clock: Clock, device: str = "cpu", repeats: int = 15) -> HostCosts:
    """The costs of the module docstring on ``device``, by ``clock``."""
    import torch

    x0 = torch.ones(1, device=device, requires_grad=True)
    xd = x0.detach()
    mul = torch.ops.aten.mul.Tensor

    def plain() -> None:
        x = xd
        for _ in range(CHAIN):
            x = x * 1.0001

    def recorded():
        x = x0
        for _ in range(CHAIN):
            x = x * 1.0001
        return x

    def forward_backward() -> None:
        recorded().backward()

    def dispatched() -> None:
        for _ in range(CHAIN):
            mul(xd, 1.0001)

    class Identity(torch.nn.Module):
        def forward(self, x):
            return x

    modules = [Identity() for _ in range(CHAIN)]

    def called() -> None:
        for m in modules:
            m(xd)

    def direct() -> None:
        for m in modules:
            m.forward(xd)

    t = {name: _median_time(fn, clock, repeats) / CHAIN for name, fn in (
        ("plain", plain), ("recorded", recorded), ("both", forward_backward), ("dispatch", dispatched),
        ("called", called), ("direct", direct))}
    return HostCosts(python_op=t["plain"], autograd=max(0.0, t["recorded"] - t["plain"]),
                     engine=max(0.0, t["both"] - t["recorded"] - t["dispatch"]),
                     module=max(0.0, t["called"] - t["direct"]), dispatch=t["dispatch"])
