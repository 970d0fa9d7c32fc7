from __future__ import annotations

import pytest
import torch

from graphflow.workflow.gcn import GCNLayer, normalized_edges


def _dense(x: torch.Tensor, edge_index: torch.Tensor, layer: GCNLayer) -> torch.Tensor:
    """The layer's formula with a dense matrix: D^-1/2 (A + I) D^-1/2 X W + b, A[dst, src] = 1."""
    n = x.shape[0]
    a = torch.zeros(n, n, dtype=torch.float64)
    a[edge_index[1], edge_index[0]] = 1.0
    a.fill_diagonal_(1.0)
    d = a.sum(dim=1).pow(-0.5)
    w = layer.lin.weight.detach().double()
    return (d[:, None] * a * d[None, :]) @ x.double() @ w.T + layer.bias.detach().double()


def test_the_layer_computes_the_normalized_convolution() -> None:
    torch.manual_seed(0)
    layer = GCNLayer(6, 4)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(5, 6)
    # a self-loop of the input (3 -> 3) counts once, as the loop the layer adds
    edge_index = torch.tensor([[0, 1, 2, 3, 3, 4], [1, 2, 0, 4, 3, 0]])
    got = layer(x, edge_index)
    assert got.shape == (5, 4)
    torch.testing.assert_close(got.double(), _dense(x, edge_index, layer), rtol=1e-6, atol=1e-6)


def test_an_isolated_node_keeps_its_own_projection() -> None:
    layer = GCNLayer(3, 2)
    x = torch.randn(3, 3)
    out = layer(x, torch.tensor([[0], [1]]))
    torch.testing.assert_close(out[2], layer.lin(x[2]) + layer.bias)


def test_normalized_edges_refuses_ids_outside_the_nodes() -> None:
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        normalized_edges(torch.tensor([[0, 3], [1, 0]]), 3, torch.float32)
    with pytest.raises(ValueError, match=r"shape \[2, E\]"):
        normalized_edges(torch.tensor([0, 1]), 3, torch.float32)


def test_same_floats_parameters_and_initialization_as_pyg_gcnconv() -> None:
    """The generator's checkpoint was trained with PyG's ``GCNConv``; this layer replaces it bit
    for bit: same parameter names, same initialization from the same seed, same outputs."""
    from torch_geometric.nn import GCNConv

    for seed in range(4):
        torch.manual_seed(seed)
        ref = GCNConv(16, 8)
        torch.manual_seed(seed)
        ours = GCNLayer(16, 8)
        assert sorted(ours.state_dict()) == sorted(ref.state_dict())
        assert torch.equal(ours.lin.weight, ref.lin.weight)
        with torch.no_grad():
            ref.bias.normal_()
        ours.load_state_dict(ref.state_dict())
        n = 12 + 9 * seed
        x = torch.randn(n, 16)
        edge_index = torch.randint(0, n, (2, 5 * n))
        assert torch.equal(ours(x, edge_index), ref(x, edge_index))
