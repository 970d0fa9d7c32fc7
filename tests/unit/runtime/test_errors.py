from __future__ import annotations

import logging

from graphflow.kv.manager import KVStateManager
from graphflow.runtime.errors import error_message, load_or_why, root_cause


class _Wrapped(RuntimeError):
    """Shaped like Ray's task error: the remote exception is kept in ``.cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::ReplicaWorker.run_node() (pid=1, ip=10.0.0.1)\n  File ...")
        self.cause = cause


def test_the_root_cause_and_its_first_line_are_shown():
    inner = ValueError("the context needs 40000 positions but tiny-llama accepts at most 32768\nmore detail")
    wrapped = _Wrapped(inner)
    assert root_cause(wrapped) is inner
    assert error_message(wrapped) == "the context needs 40000 positions but tiny-llama accepts at most 32768"
    assert error_message(KeyError()) == "KeyError"  # no message: the type's name


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
