"""A training step from per-op costs: overlap and pass times (passes), the units a step repeats (units), pipeline
ranks, bubble and data-parallel / optimizer channels (stages), bytes per rank (memory) -> step costs (assemble)."""
