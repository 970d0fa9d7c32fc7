"""Where a deployment's Ray actors are found: their namespace, names and concurrency groups."""

from __future__ import annotations

__all__ = ["BOARD_NAME", "CLIENT_GROUP", "MANAGER_NAME", "NAMESPACE", "STATUS_GROUP"]

NAMESPACE = "graphflow"
MANAGER_NAME = "graphflow-manager"
BOARD_NAME = "graphflow-board"
STATUS_GROUP = "status"  # a replica's own threads for cheap calls (queue length, stats), never behind its nodes
CLIENT_GROUP = "client"  # its threads for what a client asks before and between nodes (encode, plan, decode text)
