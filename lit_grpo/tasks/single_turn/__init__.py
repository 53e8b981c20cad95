"""Single-turn tasks: one completion per prompt, scored by rewards. Prompts from data files (``dataset``, ``jsonl``)
and the toys (``arithmetic``, ``sort``)."""
