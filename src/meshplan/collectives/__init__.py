"""Collectives on the mesh, one package for every engine (training, serving, the sharding planner, reinforcement
learning's weight synchronisation).

In data-flow order: protocols (NCCL's LL / LL128 / Simple model of a collective inside the NVLink domain), comm (the
Collective record; how a group splits over the mesh's tiers; ring, double binary tree, chain and the minimum spanning
tree under the α-β model beyond tier 0), groups (where a plan's groups sit on the ranks), allreduce (the tensor-parallel
all-reduce, with the serving engines' own kernels), dispatch (a MoE dispatch or combine forwarded through each node:
DeepEP's normal kernels), contention (two flows on one tier: the layers' traffic beside the data-parallel
collectives), price (the one dispatcher that picks among them by the same rule for every engine)."""
