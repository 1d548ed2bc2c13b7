"""A single linear layer under 2D tensor parallelism, as seed 001 accounts for it (a notebook modelling one
linear layer on an H100)."""

from __future__ import annotations

from meshplan.cost.blocks import collective
from meshplan.cost.records import ACT_BYTES, OpCost, alignment
from meshplan.xp import Num


def linear_2d(d_in: Num, d_out: Num, tokens: Num, tp_in: Num, tp_out: Num, dp: Num = 1,
              elem_bytes: int = ACT_BYTES) -> list[OpCost]:
    """Y = X·W for W of d_in × d_out sharded over a tp_in × tp_out grid, ``tokens`` split over dp.

    The per-GPU accounting of seed 001 (a notebook modelling one linear layer on an H100): each GPU holds
    N_local = (d_in/tp_in)·(d_out/tp_out) weights and b_local = tokens/dp rows.
        forward:      2·N_local·b_local FLOPs; HBM reads the weights; all-reduce of the d_out/tp_out
                      partial outputs over tp_in
        weight grad:  2·N_local·b_local FLOPs; HBM reloads the input and accumulates the gradient (r + w)
        input grad:   2·N_local·b_local FLOPs; HBM reads the weights; all-reduce of the d_in/tp_in
                      partial input gradients over tp_out
    Activations are assumed to stay in L2 between neighbouring kernels (the seed's assumption), so only the
    weights, the gradient and the reloaded input cross HBM.
    """
    din, dout, rows = d_in / tp_in, d_out / tp_out, tokens / dp
    n_local = din * dout
    flops = 2.0 * n_local * rows
    b, align = elem_bytes, alignment(din, dout)  # the weight block's dims lead every pass (records.OpCost.align)
    return [
        OpCost("linear/fwd", "fwd", "gemm", flops, n_local * b, m=rows, n=dout, k=din, align=align),
        collective("linear/tp_in", "fwd", "all_reduce", dout * rows * b, "tp_in", tp_in),
        OpCost("linear/wgrad", "bwd_w", "gemm", flops, (din * rows + 2 * n_local) * b, m=din, n=dout, k=rows,
               align=align),
        OpCost("linear/dgrad", "bwd_x", "gemm", flops, n_local * b, m=rows, n=din, k=dout, align=align),
        collective("linear/tp_out", "bwd_x", "all_reduce", din * rows * b, "tp_out", tp_out),
    ]
