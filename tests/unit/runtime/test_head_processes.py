"""Which processes are one Ray head's (the arguments its processes run with, from a head started
here with ``ray start --head --port 6399``), killing them, Ray's record of the latest cluster,
and whether a head's client proxy forks with gRPC's handlers on; no Ray is started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from graphflow.runtime.cluster import forking_proxy
from graphflow.runtime.head_processes import (
    HeadProcess,
    client_proxy_forks_with_grpc_handlers,
    forget_current_cluster,
    head_processes,
    local_addresses,
    names_head,
    stop_processes,
)

LOCAL = {"127.0.0.1", "192.0.2.2"}
BIN = "/venv/lib/python3.11/site-packages/ray/core/src/ray"


def proc(pid: int, ppid: int, *argv: str) -> HeadProcess:
    return HeadProcess(pid, ppid, argv)


def a_head(port: int, first_pid: int) -> list[HeadProcess]:
    """The processes of a head at ``port``, numbered from ``first_pid``."""
    p = first_pid
    raylet = proc(
        p + 5, 1, f"{BIN}/raylet/raylet", "--raylet_socket_name=/tmp/ray/s", f"--gcs-address=192.0.2.2:{port}"
    )
    return [
        proc(p, 1, f"{BIN}/gcs/gcs_server", "--log_dir=/tmp/ray/s/logs", f"--gcs_server_port={port}"),
        proc(p + 1, 1, "python", "-u", "ray/autoscaler/_private/monitor.py", f"--gcs-address=192.0.2.2:{port}"),
        proc(p + 2, 1, "python", "-m", "ray.util.client.server", f"--address=192.0.2.2:{port}", "--mode=proxy"),
        proc(p + 3, p + 2, "python", "-m", "ray.util.client.server", f"--address=192.0.2.2:{port}", "--port=23000"),
        proc(p + 4, 1, "python", "-u", "ray/_private/log_monitor.py", f"--gcs-address=192.0.2.2:{port}"),
        raylet,
        proc(p + 6, p + 5, "ray::RuntimeEnvAgent"),  # NOTE: workers and agents rename themselves
        proc(p + 7, p + 6, "ray::ReplicaActor"),
        proc(p + 8, p + 5, "ray::IDLE"),
    ]


def test_a_heads_processes_are_found_by_its_port_with_their_descendants():
    ours, other = a_head(6399, 100), a_head(6398, 200)
    unrelated = [proc(1, 0, "/sbin/init"), proc(300, 1, "python", "serve.py", "--port=6399")]
    found = head_processes(6399, [*other, *unrelated, *ours], LOCAL)
    assert [p.pid for p in found] == [p.pid for p in ours]  # the workers renamed "ray::…" included


def test_a_worker_node_here_of_a_cluster_headed_elsewhere_is_not_the_head():
    remote = proc(400, 1, f"{BIN}/raylet/raylet", "--gcs-address=10.0.0.9:6399")
    assert not names_head(remote.argv, 6399, LOCAL)
    assert head_processes(6399, [remote, proc(401, 400, "ray::IDLE")], LOCAL) == []


def test_only_the_gcs_server_is_named_by_its_port_flag():
    assert names_head((f"{BIN}/gcs/gcs_server", "--gcs_server_port=6399"), 6399, LOCAL)
    assert not names_head(("python", "tool.py", "--gcs_server_port=6399"), 6399, LOCAL)
    assert not names_head((f"{BIN}/gcs/gcs_server", "--gcs_server_port=6398"), 6399, LOCAL)


def test_this_machines_addresses_include_loopback():
    assert "127.0.0.1" in local_addresses()


def test_stop_processes_kills_them_and_skips_the_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = HeadProcess(2**22 + 7, 1, ("gone",))  # NOTE: above the default pid_max: no such process
        assert stop_processes([HeadProcess(child.pid, 0, ("sleep",)), gone]) == 1
        assert not psutil.pid_exists(child.pid)  # NOTE: killed and reaped (this test is its parent)
    finally:
        child.kill()


def test_the_latest_cluster_record_goes_only_when_it_names_that_head(tmp_path):
    record = tmp_path / "ray_current_cluster"
    record.write_text("127.0.0.1:6398")
    forget_current_cluster(6399, str(tmp_path))
    assert record.exists()  # another head's: left for `ray.init()` to join
    forget_current_cluster(6398, str(tmp_path))
    assert not record.exists()
    forget_current_cluster(6398, str(tmp_path))  # none: nothing to do


def _fake_proxy(port: int, **env: str) -> subprocess.Popen:
    """A process whose arguments are those of the Ray client proxy of a head at ``port``."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "--mode=proxy", f"--address=127.0.0.1:{port}"]
    return subprocess.Popen(argv, env={**os.environ, **env})


def test_a_client_proxy_forking_with_grpc_handlers_is_told_apart():
    on, off = _fake_proxy(6977), _fake_proxy(6978, GRPC_ENABLE_FORK_SUPPORT="0")
    try:
        for _ in range(100):  # NOTE: until both have exec'd (their arguments readable)
            # NOTE: between fork and exec a process's argument list reads empty
            if all((psutil.Process(p.pid).cmdline() or [""])[-1].startswith("--address") for p in (on, off)):
                break
            time.sleep(0.05)
        assert client_proxy_forks_with_grpc_handlers(6977) is True
        assert client_proxy_forks_with_grpc_handlers(6978) is False
        assert client_proxy_forks_with_grpc_handlers(6979) is None  # no head there
        assert "GRPC_ENABLE_FORK_SUPPORT=0" in forking_proxy("127.0.0.1:6977")
        assert forking_proxy("127.0.0.1:6978") == forking_proxy("10.0.0.9:6977") == forking_proxy("auto") == ""
    finally:
        on.kill()
        off.kill()
