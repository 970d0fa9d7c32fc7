from __future__ import annotations

from graphflow.runtime.errors import error_message, root_cause


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
