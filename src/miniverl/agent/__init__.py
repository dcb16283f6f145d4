"""Execution: the text protocol, the transcript builder and the rollout runner."""
