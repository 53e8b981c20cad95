"""How fast: a training step, generation, rollouts, threads, dtypes, checkpoints, the OpenMP wait policy."""
