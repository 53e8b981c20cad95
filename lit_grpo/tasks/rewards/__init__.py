"""Rewards: what a reward's answer may be (``answers``), a reward's failure kept to its completions (``guard``),
rewards as users write them (``functions``: per completion or batched, TRL's signature), a reward model
(``model``) and math answers checked with math-verify (``math_answers``)."""
