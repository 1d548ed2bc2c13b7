"""Automatic sharding of any traced PyTorch model on any device mesh: per-op placements with resharding costs,
solved as an integer program (intra-operator), and pipeline stages over sub-meshes by dynamic programming
(inter-operator), after Alpa (Zheng et al. 2022, OSDI).

    trace (trace/) ──► blocks.py (identical layers) ──► dataflow.py (producers, decisions) ──► strategies.py
    (placements, time, bytes per strategy; rules.py, ops.py, ops_nn.py, views.py) ──► problem.py (weighted nodes and
    resharding matrices; reshard.py, mesh.py) ──► ilp.py + solve.py (HiGHS, memory by liveness: memory.py)
    ──► stages.py (pipeline stages, pipeline/simulator.py) ──► output.py (DTensor placements, parallelize_module plans)

Models: models.py (Hugging Face configs, a user's factory), torch_models.py (meshplan's presets as modules);
reference.py pins Megatron-LM's layout, the plan meshplan's analytic estimate prices. docs/AUTOSHARD.md.
"""
