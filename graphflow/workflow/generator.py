"""GNN + MLP workflow generator (GraphFlow): score every wGraph edge for a task.

Graph: the wGraph's operations plus one virtual task node linked both ways to every
operation; wGraph edges are used in both directions for message passing.

.. math::
    H = \\mathrm{GCN}_2(\\mathrm{GCN}_1(X, A)),\\qquad
    s_{ij} = \\sigma\\big(\\mathrm{MLP}([h_i \\,\\|\\, h_j \\,\\|\\, h_{task}])\\big)

Args:
    in_dim: feature size of operation and task texts.
    hidden: GCN and MLP width.
    layers: 1 or 2 GCN layers.
    task_node: include the virtual task node (ablation: off).
    task_in_mlp: feed ``h_task`` to the edge MLP (ablation: off).

Shapes:
    - op_x: ``[N, in_dim]``, task_x: ``[in_dim]``, edge_index: ``[2, E]`` (wGraph edges),
      candidates: ``[2, C]`` over node ids where ``N`` denotes the task node.
    - output: ``[C]`` scores in ``[0, 1]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from graphflow.workflow.gcn import GCNLayer

__all__ = ["GeneratorConfig", "WorkflowGenerator"]


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    in_dim: int = 128
    hidden: int = 64
    layers: int = 2
    task_node: bool = True
    task_in_mlp: bool = True
    task_skip: bool = False  # h_task += task_proj(task features): see WorkflowGenerator.add_task_skip

    def __post_init__(self) -> None:
        if self.layers not in (1, 2):
            raise ValueError(f"layers must be 1 or 2, got {self.layers}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class WorkflowGenerator(nn.Module):
    def __init__(self, config: GeneratorConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        dims = [c.in_dim] + [c.hidden] * c.layers
        self.convs = nn.ModuleList(GCNLayer(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.task_proj = nn.Linear(c.in_dim, c.hidden)
        mlp_in = c.hidden * (3 if c.task_in_mlp else 2)
        self.mlp = nn.Sequential(nn.Linear(mlp_in, c.hidden), nn.ReLU(), nn.Linear(c.hidden, 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for conv in self.convs:
            assert isinstance(conv, GCNLayer)
            conv.reset_parameters()
        self.task_proj.reset_parameters()
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    @torch.no_grad()
    def add_task_skip(self) -> None:
        """Add the task's own projected features to ``h_task`` (a skip around the GCN).

        Through the GCN the virtual task node averages itself with every operation it is linked
        to, so its own features reach ``h_task`` with a weight of about 1/(number of operations
        + 1), and tasks that need different workflows look almost alike to the MLP. The skip is
        added with zero weights, so the generator's scores are unchanged until it is trained."""
        if not self.config.task_node:
            raise ValueError("without the virtual task node h_task is already the task's projection")
        self.task_proj.weight.zero_()
        self.task_proj.bias.zero_()
        self.config = replace(self.config, task_skip=True)

    @torch.no_grad()
    def soften(self, temperature: float) -> None:
        """Divide every edge logit by ``temperature`` (scale the MLP's last layer).

        A logit keeps its sign, so every score stays on its side of ½ and greedy decoding
        is unchanged; only the confidence drops. An imitation-trained generator scores most
        edges with logits near ±16, where the sigmoid's gradient is ~1e-7 and a policy
        gradient cannot move them; softening first makes them trainable again."""
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        last = self.mlp[-1]
        assert isinstance(last, nn.Linear)
        last.weight.div_(temperature)
        last.bias.div_(temperature)

    def forward(
        self, op_x: torch.Tensor, task_x: torch.Tensor, edge_index: torch.Tensor, candidates: torch.Tensor
    ) -> torch.Tensor:
        n = op_x.shape[0]
        x = torch.cat((op_x, task_x.unsqueeze(0)), dim=0)
        ei = torch.cat((edge_index, edge_index.flip(0)), dim=1)
        if self.config.task_node:
            ops = torch.arange(n, device=op_x.device)
            task = torch.full_like(ops, n)
            ei = torch.cat((ei, torch.stack((task, ops)), torch.stack((ops, task))), dim=1)
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(h, ei)
            if i < len(self.convs) - 1:
                h = torch.relu(h)
        h_task = h[n] if self.config.task_node else self.task_proj(task_x)
        if self.config.task_node and self.config.task_skip:
            h_task = h_task + self.task_proj(task_x)
        if not self.config.task_node:
            h = torch.cat((h[:n], h_task.unsqueeze(0)), dim=0)
        src, dst = h[candidates[0]], h[candidates[1]]
        parts = [src, dst] + ([h_task.expand_as(src)] if self.config.task_in_mlp else [])
        return torch.sigmoid(self.mlp(torch.cat(parts, dim=-1)).squeeze(-1))

    def __repr__(self) -> str:
        return f"WorkflowGenerator({self.config})"
