"""Where a deployment's Ray actors are found: their namespace, names and concurrency groups."""

from __future__ import annotations

__all__ = ["BOARD_NAME", "MANAGER_NAME", "NAMESPACE", "STATUS_GROUP"]

NAMESPACE = "graphflow"
MANAGER_NAME = "graphflow-manager"
BOARD_NAME = "graphflow-board"
STATUS_GROUP = "status"  # a replica's own threads for cheap calls (queue length, stats), never behind its nodes
