"""Process B of the exact-resume check: load blocks from a frame file and decode.

Usage: ``python -m graphflow.checks.resume_worker --model M --frame F --first-token T
--steps S --expect-config H --out OUT.npz``. Writes ``tokens`` and ``logits`` arrays (no pickle).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from graphflow.kv.codec import load_blocks
from graphflow.kv.errors import IncompatibleState
from graphflow.kv.packing import blocks_to_cache
from graphflow.models.engine import Engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--frame", required=True)
    parser.add_argument("--first-token", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--expect-config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    engine = Engine.load(args.model)
    if engine.identity.config_hash != args.expect_config:
        raise IncompatibleState(
            f"this process built {args.model} with config hash {engine.identity.config_hash}, "
            f"the sender had {args.expect_config}"
        )
    cache = blocks_to_cache(load_blocks(args.frame), engine.identity, engine.config, engine.device)
    result = engine.decode_greedy(cache, args.first_token, args.steps)
    np.savez(args.out, tokens=np.asarray(result.token_ids, dtype=np.int64), logits=result.logits.numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
