"""What a run does when a part fails: a vLLM server that hangs."""
