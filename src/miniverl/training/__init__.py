"""Orchestration: the trainer, memory strategies, optimizer and checkpoints."""
