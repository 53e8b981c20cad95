"""The LightningModule and what it owns: the model, its log-probs, the objective, the heads, advantages
(docs/guide.md#layout)."""
