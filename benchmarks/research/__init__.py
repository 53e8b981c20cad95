"""Studies of open questions, each folder one question (trees, risk, objectives)."""
