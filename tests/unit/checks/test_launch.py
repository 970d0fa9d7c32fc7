import subprocess
import sys
import time

from graphflow.harness.launch import _wait_both


def _spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_failed_side_ends_the_wait_without_waiting_for_the_other():
    procs = [_spawn("import time; time.sleep(60)"), _spawn("import sys; sys.exit('role 1: bytes arrived different')")]
    try:
        start = time.monotonic()
        errors = _wait_both(procs, timeout_s=60)
        assert time.monotonic() - start < 10
        assert errors == ["role 1: bytes arrived different"]
        assert procs[0].poll() is None  # NOTE: still running: the caller kills it
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_both_succeed_or_time_out():
    assert _wait_both([_spawn("print('ok')"), _spawn("pass")], timeout_s=30) == []
    procs = [_spawn("import time; time.sleep(60)"), _spawn("pass")]
    try:
        assert _wait_both(procs, timeout_s=0.5) == ["did not finish within 0.5 s"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
