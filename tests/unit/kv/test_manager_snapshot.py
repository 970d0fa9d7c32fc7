"""Snapshot pacing."""

from __future__ import annotations

import pytest

from graphflow.kv.manager_snapshot import SnapshotPacer


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
