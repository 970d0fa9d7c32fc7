"""A trained generator bound to its wGraph and encoder: task text → workflow.

Checkpoints are plain ``torch.save`` dicts of tensors, numbers and strings (loaded with
``weights_only=True``, so loading never executes code).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from graphflow.workflow.corpus import Workflow
from graphflow.workflow.decode import Candidates, decode
from graphflow.workflow.features import Encoder, HashingEncoder, op_text
from graphflow.workflow.generator import GeneratorConfig, WorkflowGenerator
from graphflow.workflow.tasks import require_task
from graphflow.workflow.wgraph import WGraph

__all__ = ["DEFAULT_CHECKPOINT", "CheckpointPlanner", "Planner"]

DEFAULT_CHECKPOINT = Path(__file__).parent / "checkpoints" / "generator.pt"


class Planner:
    def __init__(self, g: WGraph, encoder: Encoder | None = None, config: GeneratorConfig | None = None, seed: int = 0):
        self.g = g
        self.encoder = encoder or HashingEncoder()
        torch.manual_seed(seed)
        self.model = WorkflowGenerator(config or GeneratorConfig(in_dim=self.encoder.dim))
        self.cands = Candidates(g)
        self.op_x = self.encoder.encode([op_text(*k) for k in g.ops])

    def scores(self, task_x: torch.Tensor) -> torch.Tensor:
        return self.model(self.op_x, task_x, self.cands.wgraph_index, self.cands.index)

    @torch.no_grad()
    def generate(self, task: str, threshold: float = 0.5) -> Workflow:
        require_task(task)
        self.model.eval()
        nodes, edges, _ = decode(self.cands, self.scores(self.encoder.encode([task])[0]), threshold)
        return self.g.to_workflow(nodes, edges)

    def save(self, path: str | Path) -> None:
        """Write the checkpoint whole, then put it in place (``os.replace``): a replica that loads
        ``path`` meanwhile (:class:`CheckpointPlanner`) reads the old file or the new one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        torch.save(
            {
                "state_dict": self.model.state_dict(),
                "config": self.model.config.to_dict(),
                "encoder_dim": self.encoder.dim,
                "ops": [list(k) for k in self.g.ops],
                "edges": [list(e) for e in self.g.edges],
                "output_counts": list(self.g.output_counts),
                "source_counts": list(self.g.source_counts),
            },
            part,
        )
        os.replace(part, path)

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CHECKPOINT) -> Planner:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no generator checkpoint at {path}; train one with `graphflow train generator`")
        ck = torch.load(path, weights_only=True)
        g = WGraph(
            ops=tuple((o[0], o[1], int(o[2])) for o in ck["ops"]),
            edges=tuple((int(a), int(b)) for a, b in ck["edges"]),
            output_counts=tuple(ck["output_counts"]),
            source_counts=tuple(ck["source_counts"]),
        )
        planner = cls(g, HashingEncoder(int(ck["encoder_dim"])), GeneratorConfig(**ck["config"]))
        planner.model.load_state_dict(ck["state_dict"])
        return planner


class CheckpointPlanner:
    """Plans with the generator a checkpoint file holds now: loaded at the first task, and again
    at the first task after the file changed (``graphflow train generator`` rewrites the packaged
    one), so a long-running replica plans with the generator last trained. Thread-safe."""

    def __init__(self, path: str | Path = DEFAULT_CHECKPOINT) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._planner: Planner | None = None
        self._version: tuple[int, int] | None = None  # (mtime ns, size) of the file it was loaded from
        self.loads = 0

    def generate(self, task: str) -> Workflow:
        require_task(task)
        with self._lock:
            try:
                st = os.stat(self.path)
                version = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                version = None  # NOTE: Planner.load says what is missing
            if self._planner is None or version != self._version:
                self._planner, self._version = Planner.load(self.path), version
                self.loads += 1
            return self._planner.generate(task)
