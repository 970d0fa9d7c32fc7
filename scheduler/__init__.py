"""Scheduling decisions for GraphFlow (cost model, policy, eviction): pure, no I/O."""
