"""Evaluation of models against held-out data (forge.eval)."""
