"""One graph-convolution layer (Kipf & Welling) in plain torch, as the generator uses it.

.. math::
    H' = \\hat D^{-1/2} (A + I) \\hat D^{-1/2} X W + b,\\qquad \\hat D_{ii} = \\textstyle\\sum_j (A + I)_{ij}

It computes what PyTorch Geometric's ``GCNConv`` computes with its defaults (self-loops added
where missing, symmetric normalization, messages flow from ``edge_index[0]`` to
``edge_index[1]`` and are summed), in the same operations and order, so the same weights give
the same floats (``tests/unit/workflow/test_gcn.py`` checks against PyG where it is installed).
Its parameters carry ``GCNConv``'s names (``lin.weight``, ``bias``), so checkpoints load either
way. Why not import PyG: at two layers over a few dozen nodes the layer is four tensor ops, and
importing ``torch_geometric`` took 1.3–1.5 s here (most of it ``torch._dynamo``), paid by every
``graphflow submit`` and every client that plans a workflow.

Shapes:
    - x: ``[N, in_channels]``, edge_index: ``[2, E]`` (int64 node ids in ``[0, N)``).
    - output: ``[N, out_channels]``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["GCNLayer", "normalized_edges"]


def normalized_edges(edge_index: torch.Tensor, num_nodes: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges with one self-loop per node and their weights ``d_i^{-1/2} d_j^{-1/2}``.

    An edge list's own self-loops are dropped and one loop of weight 1 per node is appended, as
    PyG's ``add_remaining_self_loops`` does without edge weights; degrees count incoming edges.
    """
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if edge_index.numel() and not 0 <= int(edge_index.min()) <= int(edge_index.max()) < num_nodes:
        raise ValueError(f"edge_index names nodes outside [0, {num_nodes}); pass ids of the rows of x")
    loops = torch.arange(num_nodes, dtype=edge_index.dtype, device=edge_index.device)
    kept = edge_index[:, edge_index[0] != edge_index[1]]
    edges = torch.cat((kept, torch.stack((loops, loops))), dim=1)
    weight = torch.ones(edges.shape[1], dtype=dtype, device=edges.device)
    src, dst = edges[0], edges[1]
    degree = weight.new_zeros(num_nodes).scatter_add_(0, dst, weight)
    inv_sqrt = degree.pow_(-0.5)
    inv_sqrt.masked_fill_(inv_sqrt == float("inf"), 0)
    return edges, inv_sqrt[src] * weight * inv_sqrt[dst]


class GCNLayer(nn.Module):
    """``X W`` (no bias), each node's rows summed over its normalized in-edges, then ``+ b``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Glorot-uniform weight, zero bias (``GCNConv``'s initialization)."""
        bound = math.sqrt(6.0 / (self.lin.weight.size(-2) + self.lin.weight.size(-1)))
        self.lin.weight.uniform_(-bound, bound)
        self.bias.zero_()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        edges, weight = normalized_edges(edge_index, x.shape[0], x.dtype)
        h = self.lin(x)
        messages = weight.view(-1, 1) * h.index_select(0, edges[0])
        dst = edges[1].view(-1, 1).expand_as(messages)
        out = messages.new_zeros(h.shape).scatter_add_(0, dst, messages)
        return out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"
