"""Distributed microbenchmarks with torch.distributed: pairwise ping-pong between every two ranks (for mesh
discovery) and the collectives of comm.py along each dimension of a mesh.

One process per rank on this host (torch.multiprocessing), NCCL on GPUs (rank r on cuda:r) and gloo on CPU
tensors otherwise; they meet through a file:// rendezvous in a temporary directory. On CPU the ranks are
forked, from a single-threaded process, or else come from a fork server (a spawn would re-import PyTorch in every
rank: seconds); with CUDA they are spawned, as CUDA requires (calibrate/ranks.py).

Pairs: the circle method of round-robin tournaments pairs every two ranks once in world−1 rounds (world if it
is odd) of disjoint pairs; a round's pairs run at once, as a training step's point-to-point traffic does. The
lower rank sends n bytes and the higher sends them back; half the round trip is the one-way time.

Mesh dimensions (innermost first, as hardware.py's tiers): rank position p in ``order`` has coordinate
c_d = ⌊p / Π_{i<d} s_i⌋ mod s_d; a dimension's groups are the ranks that differ only in c_d, built with
torch.distributed.new_group. Every group of a dimension runs the collective at the same time (as all TP groups
of a job do), and a point's time is the slowest rank's. p2p is a ring shift inside the group: each rank sends
to the next and receives from the previous one (batch_isend_irecv, so NCCL cannot deadlock on the cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from meshplan.calibrate.bench import require_torch, synchronizer, time_call
from meshplan.calibrate.discover import discover_mesh, pair_matrices
from meshplan.calibrate.ranks import hand_back, run_ranks
from meshplan.calibrate.records import CollectiveSample, PairSample
from meshplan.calibrate.settings import Settings
from meshplan.errors import SpecError

FLOAT_BYTES = 4  # collectives move fp32 tensors


@dataclass(frozen=True, kw_only=True)
class DistMeasurement:
    """What the ranks measured, with the mesh the collectives ran on and the rank order it was laid out in."""

    backend: str
    mesh: tuple[int, ...]
    order: tuple[int, ...]
    pairs: tuple[PairSample, ...]
    collectives: tuple[CollectiveSample, ...]


def measure_distributed(*, world_size: int, settings: Settings, device: str = "cpu",
                        mesh: tuple[int, ...] | None = None, gap: float = 2.0) -> DistMeasurement:
    """Run ``world_size`` ranks; with ``mesh`` None the mesh is discovered from the pairwise bandwidths first."""
    if world_size == 1:
        return DistMeasurement(backend="none", mesh=(1,), order=(0,), pairs=(), collectives=())
    torch = require_torch()
    if device == "cuda" and world_size > torch.cuda.device_count():
        raise SpecError(f"world-size={world_size} exceeds the {torch.cuda.device_count()} GPUs on this host")
    return run_ranks(_rank_main, (device, settings, mesh, gap), world_size, device, "meshplan-calibrate-")


def round_robin(world: int) -> list[dict[int, int]]:
    """Rounds of disjoint pairs covering every pair once (circle method); each round maps rank → partner."""
    players: list[int | None] = list(range(world)) + ([None] if world % 2 else [])
    n = len(players)
    rounds = []
    for _ in range(n - 1):
        partner: dict[int, int] = {}
        for i in range(n // 2):
            a, b = players[i], players[n - 1 - i]
            if a is not None and b is not None:
                partner[a], partner[b] = b, a
        rounds.append(partner)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def mesh_groups(mesh: tuple[int, ...], order: tuple[int, ...], dim: int) -> list[list[int]]:
    """The groups of ranks along mesh dimension ``dim`` (see the module docstring)."""
    stride = 1
    for size in mesh[:dim]:
        stride *= size
    groups = []
    for p in range(len(order)):
        if (p // stride) % mesh[dim] == 0:
            groups.append([order[p + j * stride] for j in range(mesh[dim])])
    return groups


# ---- inside each rank -------------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, rendezvous: str, out: str, device: str, settings: Settings,
               mesh: tuple[int, ...] | None, gap: float) -> None:
    torch = require_torch()
    dist = torch.distributed
    torch.set_num_threads(1)  # ranks share the host's cores; a forked OpenMP pool must not be entered
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=settings.timeout))
    try:
        dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
        sync = synchronizer(device)
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, _pairwise(torch, rank, world, settings, dev, sync))
        pairs = tuple(p for part in everyone for p in part)
        order = tuple(range(world))
        if mesh is None:  # every rank sees the same pairs, so every rank infers the same mesh
            guess = discover_mesh(*pair_matrices(pairs, world), gap=gap)
            mesh, order = guess.shape, guess.order
        collectives = _collectives(torch, rank, mesh, order, settings, dev, sync)
        if rank == 0:
            hand_back(out, DistMeasurement(backend=backend, mesh=mesh, order=order, pairs=pairs,
                                           collectives=tuple(collectives)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _pairwise(torch: Any, rank: int, world: int, settings: Settings, dev: Any, sync: Any) -> list[PairSample]:
    dist = torch.distributed
    samples = []
    for partners in round_robin(world):
        peer = partners.get(rank)
        for size in settings.pair_sizes:
            dist.barrier()
            if peer is None:
                continue
            buf = torch.empty(size, dtype=torch.uint8, device=dev)
            if rank < peer:
                def ping(buf=buf, peer=peer) -> None:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
            else:
                def ping(buf=buf, peer=peer) -> None:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
            seconds = time_call(ping, sync, settings) / 2
            if rank < peer:
                samples.append(PairSample(src=rank, dst=peer, nbytes=float(size), seconds=seconds))
    return samples


def _collectives(torch: Any, rank: int, mesh: tuple[int, ...], order: tuple[int, ...], settings: Settings,
                 dev: Any, sync: Any) -> list[CollectiveSample]:
    dist = torch.distributed
    samples = []
    for dim, g in enumerate(mesh):
        if g == 1:
            continue
        mine, group = None, None
        for members in mesh_groups(mesh, order, dim):  # every rank creates every group, in the same order
            handle = dist.new_group(members)
            if rank in members:
                mine, group = members, handle
        assert mine is not None
        for kind in settings.kinds:
            for size in settings.comm_sizes:
                numel = max(g, size // FLOAT_BYTES // g * g)
                fn = _collective_call(torch, kind, numel, g, mine, rank, group, dev)
                dist.barrier()
                seconds = torch.tensor([time_call(fn, sync, settings)], dtype=torch.float64, device=dev)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
                if rank == 0:
                    samples.append(CollectiveSample(kind=kind, dim=dim, group=g, nbytes=float(numel * FLOAT_BYTES),
                                                    seconds=float(seconds.item())))
    return samples


def _collective_call(torch: Any, kind: str, numel: int, g: int, members: list[int], rank: int, group: Any,
                     dev: Any) -> Any:
    """A closure running one collective of comm.py's n = numel·4 bytes (its glossary's convention)."""
    dist = torch.distributed
    full = torch.ones(numel, device=dev)
    part = torch.ones(numel // g, device=dev)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":  # n = the gathered output
        return lambda: gather(full, part, group=group)
    if kind == "reduce_scatter":  # n = the input being reduced
        return lambda: scatter(part, full, group=group)
    if kind == "all_to_all":  # n = the bytes one rank sends
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if kind == "p2p":
        i = members.index(rank)
        nxt, prv = members[(i + 1) % g], members[(i - 1) % g]
        received = torch.empty_like(full)

        def shift() -> None:
            ops = [dist.P2POp(dist.isend, full, nxt), dist.P2POp(dist.irecv, received, prv)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        return shift
    raise SpecError(f"unknown collective {kind!r}")
