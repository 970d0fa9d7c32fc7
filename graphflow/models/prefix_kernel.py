"""A CPU kernel that attends a few queries over a shared prefix read from its blocks in place.

The engine loop's rows that continue a stored prefix (agents over one context) attend over it
every decode step. Held as the store's blocks (``[layers, 2, kv_heads, 16, head_dim]`` each),
a prefix has no contiguous layer, so torch's flash kernel needs each layer gathered into one
buffer first: the prefix is read twice and written once per layer per step. On this repo's
2-core AMD EPYC host, one thread, SmolLM2's shape, 8 prefixes of 1,024 tokens × 30 layers, 6
queries per KV head (two decode rows per prefix): gather + flash 46–48 ms a step, this kernel
23.5 ms; at 3 / 12 / 24 / 48 / 96 queries per KV head 45.5 / 57.0 / 80.5 / 134 / 234 ms against
18.5 / 34.3 / 58.9 / 102 / 189 (scratch timings, not a committed command; the served figures
are in ``experiments/throughput``). It reads each block once, scores 16 keys at a time
with AVX-512, keeps the softmax online, and prefetches the next block while reading one (29 ms
without that: the blocks are separate small allocations). Where the compiler does not target
AVX-512 (AVX2-only x86-64, Arm), the same source builds the same loop on portable 8-float
vectors (GCC / Clang vector extensions), so such hosts read prefixes in place too;
:attr:`PrefixKernel.isa` says which was built. The tests check it here built for AVX2, and built
for Arm (NEON) and run under emulation where Debian's ``gcc-aarch64-linux-gnu`` and
``qemu-user`` are installed (``tests/unit/models/prefix_kernel_check.c``; CI has neither, so
there it skips); it has not run on Arm hardware. Attention alone over the workload above (a scratch
timing on this host, with the portable build forced to AVX2 by ``-march=x86-64-v3``; torch's
flash measured the same with ``ATEN_CPU_CAPABILITY=avx2``): 42.3 ms a step portable, 30.7 AVX-512,
59.3 gather + flash; at head dimension 32 31.0 / 15.2 / 39.6, at 128 93.0 / 55.8 / 99.5 (little
gained there). The portable build sums each key's score across the vector's lanes one key at a
time; summing eight keys at once by a transpose of shuffles, as the AVX-512 build does, took 53
against 48 ms at head dimension 64 on AVX2, so it was not kept.
KV may be float32 or bfloat16 (a bfloat16 model's, :data:`KV_DTYPES`): bfloat16 is widened to
float32 as it is read, which is exact, scores and sums run in float32 and the output is rounded
once to the queries' dtype. On the workload above in bfloat16 (scratch timing, AVX-512 build):
25.2 ms a step against 55.5 for gather + flash over the same bfloat16 blocks. Served, it moves
little where a step is mostly linear layers: ``graphflow serve --model qwen2-0.5b-shape --json``
(bfloat16, 2 KV heads; 6087213 against ea5c8bb, alternated, 2026-12-07) measured its decode steps
at 16 rows over one 1,536-token prefix at 122.8 ms in place against 123.8 and 124.5 gathered.
Queries beyond :data:`MAX_QUERIES` per KV head (a prefill chunk's) go to flash as before: the
kernel was timed up to 96, and flash's matrix products are built for many queries.

The kernel is C (``prefix_kernel.c``) compiled on first use with the host's C compiler
(``$CC``, else ``cc``) for the host's CPU, and cached under ``$XDG_CACHE_HOME/graphflow/kernels`` (else
``~/.cache/graphflow/kernels``) by a hash of its source, flags and the CPU's feature flags. Where it
cannot be built or loaded (no C compiler, a cache it cannot run from) :func:`prefix_kernel` says why,
and prefixes are gathered as before: the results are the same attention either way, up to
float rounding (the tests bound it).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["FLAGS", "KV_DTYPES", "MAX_QUERIES", "PrefixKernel", "build", "prefix_kernel"]

MAX_QUERIES = 128  # queries per KV head this kernel takes (more: flash's products win)
HEAD_DIMS = (16, 32, 64, 128)  # what the kernel is built for
KV_DTYPES = (torch.float32, torch.bfloat16)  # what it reads (bfloat16 widened to float32 as it is read)
_SOURCE = Path(__file__).with_name("prefix_kernel.c")
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")


@dataclass(frozen=True)
class PrefixKernel:
    """The loaded kernel (``library``) and which build it is (``isa``: ``"avx512"`` or
    ``"portable 8-float vectors"``), or why there is none (``missing``)."""

    library: ctypes.CDLL | None
    missing: str = ""
    isa: str = ""

    def unusable(self, head_dim: int, dtype: torch.dtype, device: torch.device) -> str:
        """Why the kernel cannot read a model's KV of this head dimension, dtype and device
        ("" when it can)."""
        if self.library is None:
            return self.missing
        if device.type != "cpu" or dtype not in KV_DTYPES:
            return (
                f"the kernel reads float32 or bfloat16 KV on the CPU, "
                f"not {str(dtype).removeprefix('torch.')} on {device.type}"
            )
        if head_dim not in HEAD_DIMS:
            return f"the kernel is built for head dimensions {HEAD_DIMS}, not {head_dim}"
        return ""

    def blocks(self, parts: list[torch.Tensor]) -> torch.Tensor | None:
        """The kernel's description of ``parts`` (each ``[layers, 2, kv_heads, tokens,
        head_dim]``, all of one dtype): a row per part of its address, tokens, layer / key-value /
        head / token strides in elements and element bytes (``BLOCK_FIELDS`` in the C source), or
        ``None`` when it cannot read them (:meth:`unusable`, mixed dtypes, or a head dimension
        that is not contiguous)."""
        if len({p.dtype for p in parts}) > 1:
            return None
        if any(self.unusable(int(p.shape[4]), p.dtype, p.device) or p.stride(4) != 1 for p in parts):
            return None
        return torch.tensor(
            [
                [p.data_ptr(), p.shape[3], p.stride(0), p.stride(1), p.stride(2), p.stride(3), p.element_size()]
                for p in parts
            ],
            dtype=torch.int64,
        )

    def attend(
        self, q: torch.Tensor, blocks: torch.Tensor, layer: int, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of ``q`` ``[kv_heads, queries, head_dim]`` over layer ``layer`` of the
        blocks ``blocks`` describes, in ``q``'s dtype, and each query's log-sum-exp (float32).
        The kernel computes in float32: bfloat16 queries and KV are widened exactly."""
        assert self.library is not None, self.missing
        heads, queries, dim = q.shape
        q32 = q.to(torch.float32).contiguous()
        out = torch.empty_like(q32)
        lse = torch.empty((heads, queries), dtype=torch.float32)
        failed = self.library.prefix_attend(
            q32.data_ptr(), heads, queries, dim, scale, blocks.data_ptr(), blocks.shape[0], layer,
            out.data_ptr(), lse.data_ptr(),
        )  # fmt: skip
        if failed == 1:
            raise ValueError(f"the prefix kernel has no head dimension {dim} (it has {HEAD_DIMS})")
        if failed:
            raise ValueError("the prefix kernel reads float32 or bfloat16 blocks, not these")
        return out.to(q.dtype), lse


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "graphflow" / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def build(compiler: str | None = None, cache: Path | None = None, flags: tuple[str, ...] = FLAGS) -> PrefixKernel:
    """Compile (or find already compiled) and load the kernel; never raises: a kernel that
    cannot be built comes back with ``missing`` saying why. ``flags``: the compiler's (the
    tests build the portable variant with ``-march=x86-64-v3`` in ``-march=native``'s place)."""
    compiler = compiler or os.environ.get("CC") or "cc"
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), compiler.encode(), _cpu_flags().encode(),
                                     platform.machine().encode()])).hexdigest()[:16]  # fmt: skip
    cache = cache or _cache_dir()
    target = cache / f"prefix_kernel-{key}.so"
    if not target.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:  # NOTE: built aside, renamed in: replicas may race
                built = Path(tmp) / target.name
                done = subprocess.run(
                    [compiler, *flags, str(_SOURCE), "-o", str(built), "-lm"],
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                if done.returncode != 0:
                    error = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip())
                    return PrefixKernel(None, f"{compiler} could not build it: {error.strip()[:200]}")
                os.replace(built, target)
        except (OSError, subprocess.SubprocessError) as exc:
            return PrefixKernel(None, f"it could not be built with {compiler}: {exc}")
    try:
        library = ctypes.CDLL(str(target))
    except OSError as exc:  # e.g. a cache on a filesystem mounted noexec
        return PrefixKernel(None, f"the built kernel could not be loaded: {exc}")
    library.prefix_attend.restype = ctypes.c_int
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    library.prefix_attend.argtypes = [ptr, i64, i64, i64, ctypes.c_float, ptr, i64, i64, ptr, ptr]
    library.prefix_kernel_isa.restype = ctypes.c_char_p
    return PrefixKernel(library, isa=library.prefix_kernel_isa().decode())


@functools.cache
def prefix_kernel() -> PrefixKernel:
    """This process's kernel, built on the first call."""
    return build()
