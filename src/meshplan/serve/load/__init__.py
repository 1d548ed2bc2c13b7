"""Serving under load, in data-flow order: requests that arrive by a process (arrivals.py) with lengths from a
distribution (lengths.py), iteration prices from serve's own cost model on a grid (prices.py), speculative decoding
as a plan choice (speculation.py), an engine's scheduler as data (scheduler.py), the iteration-level simulation
(simulate.py, timeline.py), disaggregated prefill and decode pools (disagg.py), its latency percentiles and goodput
(summary.py), one configuration under a load (run.py), the search and recommendation under it (under_load.py), and
latency against the load (sweep.py)."""
