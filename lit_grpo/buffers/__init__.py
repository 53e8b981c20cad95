"""Rollout data below both sides: the buffer, the tree layout, first-token constraints, positions, and the
Protocols through which the policy and rollout sides see each other."""
