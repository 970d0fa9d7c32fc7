"""The namespace cluster's preconditions and what it must leave behind (integration tests)."""

from __future__ import annotations

import os
import shutil
import subprocess


def namespaces_allowed() -> bool:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    ok = subprocess.run(["ip", "netns", "add", "gfc-probe"], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", "gfc-probe"], capture_output=True)
    return ok


def leftovers() -> dict[str, object]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {
        "namespaces": [ln for ln in netns.splitlines() if ln.startswith("gfc-node-")],
        "links": [ln for ln in links.splitlines() if "gfc" in ln],
    }
