"""The benchmark lab: one folder per question (benchmarks/README.md); results/ holds what the scripts wrote."""
