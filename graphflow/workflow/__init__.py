"""Workflow layer: the wGraph, task features, the GNN + MLP subgraph generator, decoding,
training, evaluation, and compilation of a workflow to the stateful execution graph."""
