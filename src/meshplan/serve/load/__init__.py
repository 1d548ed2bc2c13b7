"""Serving under load: requests that arrive by a process (arrivals.py) with lengths from a distribution
(lengths.py), an engine's scheduler as data (scheduler.py), iteration prices from serve's own cost model on a grid
(prices.py), the iteration-level simulation (simulate.py), its latency percentiles and goodput (summary.py), and the
search and recommendation under a request rate (under_load.py)."""
