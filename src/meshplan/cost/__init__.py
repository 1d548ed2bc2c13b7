"""Per-op cost records: the FLOPs, bytes and collectives of every op of a layer, forward and backward."""
