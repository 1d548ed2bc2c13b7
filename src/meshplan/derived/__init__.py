"""What is derived from an estimate (estimate.py): the step's energy (energy.py), a run's goodput under failures and
checkpoints (goodput.py), and a plan priced on a mixed cluster's pools, one estimate per pool's ranks composed
(mixed.py). Each reads an Estimate or calls ``estimate``; none is read by it."""
