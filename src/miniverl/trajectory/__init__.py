"""Masks, the j -> j-1 alignment and JSONL I/O of trajectories (no torch)."""
