"""A real slow link on one machine: two network namespaces joined by a veth pair, shaped by tc.

```
  netns gf-a                         netns gf-b
  veth gfa0 10.231.0.1/24 ─────────  veth gfb0 10.231.0.2/24
  tbf rate R                          tbf rate R
```

Traffic between processes started in the two namespaces crosses the shaped link; nothing
leaves the machine. UCX must be told to use tcp on that device (``UCX_TLS=tcp,self``),
otherwise it would pick shared memory (``cma``), which ignores namespaces. Needs root and
iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from graphflow.runtime.errors import Unavailable

__all__ = ["ShapedLink", "run_checked", "shaped_link"]


@dataclass(frozen=True, slots=True)
class ShapedLink:
    rate_mbit: float
    namespaces: tuple[str, str] = ("gf-a", "gf-b")
    devices: tuple[str, str] = ("gfa0", "gfb0")
    addresses: tuple[str, str] = ("10.231.0.1", "10.231.0.2")

    def prefix(self, role: int) -> list[str]:
        """Command prefix that runs a process inside role's namespace."""
        return ["ip", "netns", "exec", self.namespaces[role]]

    def env(self, role: int) -> dict[str, str]:
        return {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": self.devices[role]}


def run_checked(*cmd: str) -> None:
    """Run an iproute2 command; a failure raises one sentence with its stderr."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if proc.returncode != 0:
        raise Unavailable(
            f"`{' '.join(cmd)}` failed: {proc.stderr.strip()} (network namespaces need root and iproute2)"
        )


@contextmanager
def shaped_link(rate_mbit: float) -> Iterator[ShapedLink]:
    """Create the namespaces and the shaped veth pair; always torn down on exit."""
    if rate_mbit <= 0:
        raise ValueError(f"link rate must be positive, got {rate_mbit} Mbit/s")
    if not shutil.which("ip") or not shutil.which("tc"):
        raise Unavailable("iproute2 (ip, tc) is not installed; apt-get install iproute2")
    link = ShapedLink(rate_mbit)
    (na, nb), (da, db), (aa, ab) = link.namespaces, link.devices, link.addresses
    for ns in link.namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        run_checked("ip", "netns", "add", na)
        run_checked("ip", "netns", "add", nb)
        run_checked("ip", "link", "add", da, "netns", na, "type", "veth", "peer", "name", db, "netns", nb)
        for ns, dev, addr in ((na, da, aa), (nb, db, ab)):
            run_checked("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            run_checked("ip", "-n", ns, "link", "set", dev, "up")
            run_checked("ip", "-n", ns, "link", "set", "lo", "up")
            burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 / 250))  # ≥ 4 ms worth of bytes
            run_checked(
                "ip",
                "netns",
                "exec",
                ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit}mbit",
                "burst",
                str(burst),
                "latency",
                "50ms",
            )
        yield link
    finally:
        for ns in link.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
