"""The DataModule and what it owns: prompts, the engine, rewards, drawing and scoring rollouts, greedy evaluation."""
