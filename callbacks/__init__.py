"""Callbacks around the training loop, installed as ``lit_grpo.callbacks``."""
