"""Exact-resume check: KV packed to blocks, moved to a fresh process, decodes bit-identically.

```
process A: prefill N tokens ─► cache ─► blocks ─► frame file ──┐
           decode 16 from the cache (reference)                 │
           full recompute of prompt + reference tokens          │
process B (fresh):                     frame file ─► blocks ─► cache ─► decode 16
```

Both decodes start from the same first token (the argmax of A's prefill logits) and run the
same one-token forwards, so with identical KV their logits must be identical, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from graphflow.kv.codec import save_blocks
from graphflow.kv.packing import cache_to_blocks
from graphflow.models.engine import Engine, clone_cache
from graphflow.models.prompts import prompt_token_ids
from graphflow.models.registry import resolve

__all__ = ["ExactCheckResult", "run_exact_check"]


@dataclass(frozen=True, slots=True)
class ExactCheckResult:
    model: str
    config_hash: str
    tokens: int
    steps: int
    blocks: int
    kv_bytes: int
    frame_bytes: int
    cross_process: bool
    tokens_equal: bool
    tokens_equal_vs_recompute: bool
    max_abs_logit_diff_vs_cache: float
    max_abs_logit_diff_vs_recompute: float
    prefill_s: float
    resume_process_s: float
    reference_text: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def run_exact_check(
    model: str,
    tokens: int = 256,
    steps: int = 16,
    block_tokens: int = 16,
    say: Callable[[str], None] = lambda _m: None,
) -> ExactCheckResult:
    """Run the check; see the module docstring. Raises ``RuntimeError`` if process B fails."""
    if tokens <= 0 or steps <= 0:
        raise ValueError(f"tokens and steps must be positive, got {tokens}, {steps}")
    resolve(model)  # NOTE: an unknown name fails here, before any progress output
    say(f"loading {model}")
    engine = Engine.load(model, say=say)
    ids = prompt_token_ids(engine.tokenizer, tokens)
    say(f"prefilling {tokens} tokens")
    pre = engine.prefill(ids)
    first = int(torch.argmax(pre.logits))
    blocks = cache_to_blocks(pre.cache, ids, engine.identity, block_tokens)
    with tempfile.TemporaryDirectory(prefix="graphflow-exact-") as tmp:
        frame = Path(tmp) / "state.gfkv"
        out = Path(tmp) / "resumed.npz"
        frame_bytes = save_blocks(frame, blocks)
        say("resuming in a fresh process")
        t0 = time.perf_counter()
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "graphflow.checks.resume_worker",
                "--model",
                model,
                "--frame",
                str(frame),
                "--first-token",
                str(first),
                "--steps",
                str(steps),
                "--expect-config",
                engine.identity.config_hash,
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        ref = engine.decode_greedy(clone_cache(pre.cache), first, steps)
        full = engine.full_logits(ids + [first] + list(ref.token_ids[:-1]))[tokens : tokens + steps]
        _, err = worker.communicate()
        resume_s = time.perf_counter() - t0
        if worker.returncode != 0:
            raise RuntimeError(
                f"the resume process failed: {err.strip().splitlines()[-1] if err.strip() else worker.returncode}"
            )
        with np.load(out, allow_pickle=False) as data:
            resumed_tokens = tuple(int(t) for t in data["tokens"])
            resumed_logits = torch.from_numpy(data["logits"])
    return ExactCheckResult(
        model=model,
        config_hash=engine.identity.config_hash,
        tokens=tokens,
        steps=steps,
        blocks=len(blocks),
        kv_bytes=sum(b.nbytes for b in blocks),
        frame_bytes=frame_bytes,
        cross_process=True,
        tokens_equal=resumed_tokens == ref.token_ids,
        tokens_equal_vs_recompute=tuple(int(t) for t in full.argmax(-1)) == ref.token_ids,
        max_abs_logit_diff_vs_cache=float((resumed_logits - ref.logits).abs().max()),
        max_abs_logit_diff_vs_recompute=float((full - ref.logits).abs().max()),
        prefill_s=pre.seconds,
        resume_process_s=resume_s,
        reference_text=engine.tokenizer.decode([first, *ref.token_ids]),
    )


def print_json(result: ExactCheckResult) -> None:
    print(json.dumps(result.to_dict()))
