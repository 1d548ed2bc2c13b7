"""The host-bound note of ``meshplan estimate`` (issue 46: the host that launches kernels is a resource): where the
GPUs wait on the host for a share of the step, say so, with the host cost per kernel the stack pays and what the same
plan would take with its layers captured as CUDA graphs (one launch per layer and pass, step/host.py), the remedy
Megatron-Core (--cuda-graph-impl) and torch.compile (mode="reduce-overhead") offer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshplan.step.host import on_host
from meshplan.units import fmt_time

if TYPE_CHECKING:
    from meshplan.estimate import Estimate

HOST_BOUND_SHARE = 0.10  # the note's threshold: the GPUs wait on the host for at least this share of the step


@dataclass(frozen=True)
class HostNote:
    """The GPUs' wait on the host (seconds, share of the step: the passes' wait, the optimizer step's per-parameter
    loops and the training loop's per step), the host seconds per kernel on this host, the optimizer loops' and the
    training loop's seconds of it, and the step time of the same plan under CUDA graphs (None where the stack
    already captures them)."""

    wait: float
    share: float
    per_kernel: float
    graphed_step: float | None
    tensor_loops: float = 0.0  # of ``wait``: the optimizer step's per-parameter loops (step/host.step_host)
    training_loop: float = 0.0  # of ``wait``: the training loop's own, per micro-batch and per step (loop/ rows)
    module_hooks: float = 0.0  # host seconds of DeepSpeed ZeRO-3's module hooks (the */zero3_hooks rows)

    def to_dict(self) -> dict[str, Any]:
        return {"host_wait_s": self.wait, "host_wait_share": self.share, "host_dispatch_s": self.per_kernel,
                "optimizer_host_s": self.tensor_loops, "training_loop_host_s": self.training_loop,
                "module_hooks_host_s": self.module_hooks,
                "cuda_graphs_step_time_s": self.graphed_step}

    def text(self) -> str:
        line = (f"host-bound: the GPUs wait on the host {fmt_time(self.wait)} ({100 * self.share:.0f} % of the step) "
                f"at {fmt_time(self.per_kernel)} of host time per launched kernel")
        if self.tensor_loops:
            line += (f", {fmt_time(self.tensor_loops)} of it in the optimizer step's per-parameter loops "
                     "(--ops: optimizer/host)")
        if self.training_loop:
            line += (f", {fmt_time(self.training_loop)} in the training loop's own work, which CUDA graphs of the "
                     "layers leave as it is (--ops: loop/)")
        if self.module_hooks:
            line += (f", {fmt_time(self.module_hooks)} of host time in ZeRO-3's module hooks, which CUDA graphs leave "
                     "as they are (--ops: zero3_hooks)")
        if self.graphed_step is not None:
            line += (f"; with the layers captured as CUDA graphs (--cuda-graphs, where the framework can) this plan "
                     f"takes {fmt_time(self.graphed_step)}")
        return line + "; a larger micro-batch does more work per launch"


def host_note(est: Estimate) -> HostNote | None:
    """The note for ``est``, or None where the host's wait (the passes', the optimizer step's per-parameter loops and
    the training loop's per step: the per-op table's optimizer/host and loop/step) is under HOST_BOUND_SHARE of
    the step."""
    per_step = {name: sum(r.seconds * r.count for r in est.ops if r.name == name)
                for name in ("optimizer/host", "loop/step", "loop/micro_batch")}
    loops, logging = per_step["optimizer/host"], per_step["loop/step"]
    training_loop = logging + per_step["loop/micro_batch"]  # the micro-batches' share is in the passes' wait
    wait = float(est.breakdown.get("host", 0.0)) + loops + logging
    if est.step_time <= 0 or wait < HOST_BOUND_SHARE * est.step_time:
        return None
    graphed = None
    if not est.stack.cuda_graphs:
        from meshplan.estimate import estimate  # noqa: PLC0415  (the graphed twin of the same plan)
        graphed = estimate(est.model, est.cluster, est.plan, est.stack.with_(cuda_graphs=True)).step_time
    # the host pays the stack's cost per kernel at its own CPU's speed (Cluster.python_host, step/host.on_host)
    per_kernel = on_host(est.stack, est.cluster.python_host).host_dispatch
    hooks = sum(r.seconds * r.count for r in est.ops if r.name.endswith("/zero3_hooks"))
    return HostNote(wait=wait, share=wait / est.step_time, per_kernel=per_kernel, graphed_step=graphed,
                    tensor_loops=loops, training_loop=training_loop, module_hooks=float(hooks))
