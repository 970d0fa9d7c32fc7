"""A shaped link must bind: UCX between processes in the two namespaces crosses the tc-shaped
veth, so a transfer's rate is the link's, not shared memory's."""

from __future__ import annotations

import os
import shutil

import pytest

from graphflow.harness.launch import run_two_processes
from graphflow.harness.netns import shaped_link

pytestmark = [
    pytest.mark.ucx,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="network namespaces need root and tc"),
]


def test_ucx_transfer_runs_at_the_shaped_rate():
    job = ["--job", "probe", "--sizes", str(4 << 20), "--block-bytes", str(1 << 20), "--repeats", "2"]
    with shaped_link(200) as link:
        _, samples = run_two_processes("ucx", job, timeout_s=120, link=link)
    ((nbytes, seconds),) = samples
    mbit = nbytes * 8 / seconds / 1e6
    assert 100 < mbit < 240, f"{mbit:.0f} Mbit/s through a 200 Mbit/s link"
