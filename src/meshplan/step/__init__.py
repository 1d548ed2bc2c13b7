"""A training step from per-op costs: overlap and pass times (passes), what runs beside the passes (channels: the
data-parallel collectives, offload copies, the optimizer), the units a step repeats (units), pipeline ranks and update
cadence (stages), bytes per rank (memory) -> the step composed once, with its channels, optimizer and bubble, for one
plan or a batch under a grid of settings (assemble)."""
