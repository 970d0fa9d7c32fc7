"""Snapshot pacing and the restore that says why it started empty."""

from __future__ import annotations

import logging

import pytest

from graphflow.kv.manager import KVStateManager
from graphflow.kv.manager_snapshot import SnapshotPacer, load_or_why


def test_the_pacer_allows_one_snapshot_per_interval():
    now = [0.0]
    pacer = SnapshotPacer("/tmp/x", every_s=5.0, clock=lambda: now[0])
    assert pacer.due() is True and pacer.due() is False
    now[0] = 4.9
    assert pacer.due() is False
    now[0] = 5.0
    assert pacer.due() is True
    with pytest.raises(ValueError, match="every_s"):
        SnapshotPacer("/tmp/x", every_s=-1)


def test_a_missing_snapshot_is_said_and_logged_not_swallowed(tmp_path, caplog):
    mgr = KVStateManager()
    with caplog.at_level(logging.WARNING, logger="graphflow"):
        why = load_or_why(lambda: mgr.load_snapshot(tmp_path / "none"), tmp_path / "none")
    assert "not loaded" in why and "no manager snapshot" in why and "starting empty" in why
    assert why in caplog.text


def test_a_loaded_snapshot_has_nothing_to_say(tmp_path):
    KVStateManager().snapshot(tmp_path / "snap")
    mgr = KVStateManager()
    assert load_or_why(lambda: mgr.load_snapshot(tmp_path / "snap"), tmp_path / "snap") == ""
