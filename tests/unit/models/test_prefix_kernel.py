from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from graphflow.kv.packing import stack_cache
from graphflow.models import prefix_kernel as kernel_module
from graphflow.models.prefix_kernel import FLAGS, MAX_QUERIES, PrefixKernel, build, prefix_kernel
from graphflow.models.ragged import Row, SharedPrefix, attend, forward_rows

TOL = 1e-5


def _kernel():
    kernel = prefix_kernel()
    if kernel.library is None:
        pytest.skip(f"no prefix kernel on this host: {kernel.missing}")
    return kernel


def _avx512() -> bool:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return " avx512f " in f.read()


@pytest.mark.skipif(platform.machine() != "x86_64" or not _avx512(), reason="the AVX-512 build needs an AVX-512 host")
def test_the_kernel_builds_on_an_avx512_host():
    assert prefix_kernel().missing == "" and prefix_kernel().isa == "avx512"
    assert prefix_kernel() is prefix_kernel()  # built once a process


PORTABLE_FLAGS = tuple("-march=x86-64-v3" if f == "-march=native" else f for f in FLAGS)  # AVX2: no AVX-512


@pytest.fixture(scope="module")
def portable(tmp_path_factory) -> PrefixKernel:
    """The build a host without AVX-512 gets (AVX2 here), so this host tests it too."""
    if platform.machine() != "x86_64":
        pytest.skip("an x86-64 target is how this test asks for a build without AVX-512")
    kernel = build(flags=PORTABLE_FLAGS, cache=tmp_path_factory.mktemp("kernels"))
    assert kernel.missing == "", kernel.missing
    assert kernel.isa == "portable 8-float vectors"
    return kernel


def _blocks(kv: torch.Tensor, tokens: int) -> list[torch.Tensor]:
    return [part.contiguous() for part in kv.split(tokens, dim=3)]


@pytest.mark.parametrize(
    ("dim", "kv_heads", "group", "t", "length", "block"),
    [
        (64, 3, 3, 2, 1024, 16),  # SmolLM2's shape, two decode rows
        (64, 2, 2, 1, 100, 16),  # a partial last block
        (64, 1, 7, 1, 70, 32),  # blocks longer than the kernel's 16 keys; 7 queries: past one register pass
        (128, 2, 4, 3, 90, 16),
        (64, 2, 1, 40, 33, 16),  # 40 queries a head, one key in the last block
        (16, 2, 2, 5, 48, 16),  # the tiny test models' heads
        (32, 1, 4, 1, 17, 16),
    ],
)
def test_the_kernel_equals_attention_over_the_joined_prefix(dim, kv_heads, group, t, length, block):
    _kernel()
    torch.manual_seed(0)
    kv = torch.randn(3, 2, kv_heads, length, dim)
    q = torch.randn(1, kv_heads * group, t, dim)
    held = SharedPrefix(_blocks(kv, block))
    assert held.in_place
    for layer in range(3):
        want, want_lse = attend(q, kv[layer, 0][None], kv[layer, 1][None], dim**-0.5, causal=False)
        got, lse = held.attend(layer, q, dim**-0.5)
        assert got.shape == want.shape and lse.shape == want_lse.shape
        assert torch.allclose(got, want, atol=TOL) and torch.allclose(lse, want_lse, atol=TOL)


@pytest.mark.parametrize(
    ("dim", "kv_heads", "group", "t", "length", "block"),
    [
        (64, 3, 3, 2, 1024, 16),
        (64, 2, 2, 1, 100, 16),  # a partial last block: fewer keys than the vector is wide
        (64, 1, 7, 1, 70, 32),  # 7 queries: four register passes of 2, the last one short
        (128, 2, 4, 3, 90, 16),  # 12 queries, a pass each
        (64, 2, 1, 40, 33, 16),
        (16, 2, 2, 5, 48, 16),
        (32, 1, 4, 1, 17, 16),
        (64, 1, 1, 1, 3, 16),  # one block of three keys
    ],
)
def test_the_portable_build_equals_attention_over_the_joined_prefix(portable, dim, kv_heads, group, t, length, block):
    torch.manual_seed(1)
    kv = torch.randn(2, 2, kv_heads, length, dim) * 3  # scores spread wide: the exponential's range matters
    q = torch.randn(1, kv_heads * group, t, dim)
    parts = _blocks(kv, block)  # NOTE: held while the kernel reads them: it reads their addresses
    blocks = portable.blocks(parts)
    assert blocks is not None
    for layer in range(2):
        want, want_lse = attend(q, kv[layer, 0][None], kv[layer, 1][None], dim**-0.5, causal=False)
        got, lse = portable.attend(q.reshape(kv_heads, group * t, dim).contiguous(), blocks, layer, dim**-0.5)
        assert torch.allclose(got.view_as(want), want, atol=TOL)
        assert torch.allclose(lse.view_as(want_lse), want_lse, atol=TOL)


@pytest.mark.parametrize("build_of", ["native", "portable"])
@pytest.mark.parametrize(("dim", "group", "t"), [(64, 3, 2), (128, 7, 1), (16, 2, 5)])
def test_bfloat16_blocks_are_read_as_float32(request, build_of, dim, group, t):
    """A bfloat16 model's blocks: the kernel widens them exactly, so it matches float32 attention
    over the same (bfloat16) values within float32 rounding, and answers in the queries' dtype."""
    kernel = _kernel() if build_of == "native" else request.getfixturevalue("portable")
    torch.manual_seed(2)
    kv = (torch.randn(2, 2, 2, 70, dim) * 3).bfloat16()
    q = torch.randn(1, 2 * group, t, dim).bfloat16()
    parts = _blocks(kv, 16)
    blocks = kernel.blocks(parts)
    assert blocks is not None
    for layer in range(2):
        want, want_lse = attend(q.float(), kv[layer, 0][None].float(), kv[layer, 1][None].float(), dim**-0.5, False)
        got, lse = kernel.attend(q.reshape(2, group * t, dim), blocks, layer, dim**-0.5)
        assert got.dtype == torch.bfloat16 and lse.dtype == torch.float32
        assert torch.allclose(lse.view_as(want_lse), want_lse, atol=TOL)
        # float32 results rounded once to bfloat16: within half a bfloat16 step (2**-8 relative)
        assert torch.allclose(got.view_as(want).float(), want, rtol=2**-8, atol=TOL)


def test_a_gathered_prefix_and_many_queries_take_flash():
    torch.manual_seed(0)
    kv = torch.randn(2, 2, 1, 48, 64)
    gathered = SharedPrefix(_blocks(kv, 16), in_place=False)
    assert not gathered.in_place
    many = torch.randn(1, 1, MAX_QUERIES + 1, 64)  # a prefill chunk's queries
    want = attend(many, kv[1, 0][None], kv[1, 1][None], 0.125, causal=False)
    for prefix in (gathered, SharedPrefix(_blocks(kv, 16))):
        got = prefix.attend(1, many, 0.125)
        assert torch.allclose(got[0], want[0], atol=TOL) and torch.allclose(got[1], want[1], atol=TOL)


def test_blocks_the_kernel_cannot_read_are_gathered():
    kernel = _kernel()
    kv = torch.randn(2, 2, 1, 32, 64)
    assert kernel.blocks(_blocks(kv.half(), 16)) is None  # float32 and bfloat16 only
    assert kernel.blocks(_blocks(kv, 16)[:1] + _blocks(kv.bfloat16(), 16)[1:]) is None  # one dtype a prefix
    assert kernel.blocks(_blocks(torch.randn(2, 2, 1, 32, 48), 16)) is None  # head dimensions it was built for
    assert not SharedPrefix(_blocks(kv.double(), 16)).in_place
    assert not SharedPrefix.from_tensor(kv).in_place  # one part: its layers are views already


def test_a_kernel_that_cannot_be_built_says_why(tmp_path):
    missing = build(compiler=str(tmp_path / "no-such-cc"), cache=tmp_path).missing
    assert "could not be built with" in missing and "no-such-cc" in missing
    (tmp_path / "cc").write_text("#!/bin/sh\necho 'x.c:1: error: no compiler here' >&2\nexit 1\n")
    (tmp_path / "cc").chmod(0o755)
    failed = build(compiler=str(tmp_path / "cc"), cache=tmp_path / "cache")
    assert failed.library is None and "error: no compiler here" in failed.missing
    (tmp_path / "cc").write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\necho junk > "$2"\n')
    broken = build(compiler=str(tmp_path / "cc"), cache=tmp_path / "broken")  # "built", but not a library
    assert broken.library is None and "could not be loaded" in broken.missing


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, TOL), (torch.bfloat16, 0.02)])
def test_rows_over_a_prefix_read_in_place_decode_as_over_a_gathered_one(dtype, tol):
    """Same tokens; logits within float32 rounding, or within bfloat16's (flash rounds its
    bfloat16 output, the kernel its own, and later layers carry the difference)."""
    _kernel()
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=259, hidden_size=384, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval().to(dtype)
    root = list(range(3, 83))  # 80 tokens: five blocks of 16
    with torch.inference_mode():
        cache = DynamicCache()
        model(torch.tensor([root]), cache=cache, use_cache=True)
    kv = stack_cache(cache)
    tokens = {}
    for in_place in (True, False):
        prefix = SharedPrefix(_blocks(kv, 16), in_place=in_place)
        assert prefix.in_place is in_place
        rows = [Row([7 + i, 9], DynamicCache(), prefix) for i in range(4)]
        steps = [forward_rows(model, rows)]
        for _ in range(5):
            nexts = [Row([int(x.argmax())], r.cache, prefix) for x, r in zip(steps[-1], rows, strict=True)]
            steps.append(forward_rows(model, nexts))
        tokens[in_place] = torch.stack([torch.stack(s) for s in steps])
    assert torch.allclose(tokens[True].float(), tokens[False].float(), atol=tol)
    assert torch.equal(tokens[True].argmax(-1), tokens[False].argmax(-1))


ARM_CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")


@pytest.mark.skipif(
    not (ARM_CC and QEMU), reason="needs Debian's gcc-aarch64-linux-gnu and qemu-user (an Arm compiler and emulator)"
)
def test_the_portable_build_is_right_on_arm(tmp_path):
    """The portable build for Arm (NEON), run under emulation by a C program of its own."""
    assert ARM_CC and QEMU
    source = Path(kernel_module.__file__).with_name("prefix_kernel.c")
    check = Path(__file__).with_name("prefix_kernel_check.c")
    subprocess.run([ARM_CC, "-O3", "-c", str(source), "-o", str(tmp_path / "kernel.o")], check=True)
    # NOTE: the check itself at -O1: GCC 12's Arm vectorizer stops with an internal error on its loops
    program = tmp_path / "check"
    subprocess.run(
        [ARM_CC, "-O1", "-static", str(check), str(tmp_path / "kernel.o"), "-o", str(program), "-lm"], check=True
    )
    done = subprocess.run([QEMU, str(program)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("portable 8-float vectors: worst absolute error")
