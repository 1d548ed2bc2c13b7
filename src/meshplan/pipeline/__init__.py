"""Pipeline schedules: each one's action table, the simulator that times any table, its bubble over per-rank times,
its activations in flight, its weight copies, its refusals and the frameworks that run it (registry.py: one record a
schedule; every caller asks it, none compares a schedule's name)."""
