"""The namespace cluster's plain parts: link specs, per-pair rates, node naming (no root needed)."""

from __future__ import annotations

import json

import pytest

from graphflow.harness.cluster import ClusterNode, ClusterSpec, NamespaceCluster, parse_links


def test_links_parse_as_a_default_and_per_pair_rates():
    assert parse_links("") == ("", {})
    assert parse_links("1gbit") == ("1gbit", {})
    default, pairs = parse_links("2-0=50mbit, 0-1=10gbit, 200mbit")
    assert default == "200mbit" and pairs == {(0, 2): "50mbit", (0, 1): "10gbit"}
    spec = ClusterSpec(3, default, pairs)
    assert spec.rate(2, 0) == spec.rate(0, 2) == "50mbit" and spec.rate(1, 2) == "200mbit"


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"nodes": 0}, "1 to 16 nodes"),
        ({"nodes": 2, "pair_links": {(0, 2): "1gbit"}}, "does not name two of nodes 0..1"),
        ({"nodes": 2, "link": "fast"}, "a link rate is a positive number"),
        ({"nodes": 2, "link": "-3mbit"}, "a link rate is a positive number"),
        ({"nodes": 2, "delay_ms": -1.0}, "non-negative"),
    ],
)
def test_bad_cluster_specs_say_what_is_wrong(kwargs, said):
    with pytest.raises(ValueError, match=said):
        ClusterSpec(**kwargs)


def test_a_malformed_pair_is_refused():
    with pytest.raises(ValueError, match="NODE-NODE=RATE"):
        parse_links("a-b=1gbit")


def test_nodes_are_named_and_addressed_by_index():
    node = ClusterNode.of(2)
    assert (node.namespace, node.device, node.address) == ("gfc-node-2", "gfc2", "10.233.0.3")
    env = node.env()
    assert env["UCX_TLS"] == "tcp,sm,self" and env["UCX_NET_DEVICES"] == env["GRAPHFLOW_UCX_NET_DEVICES"] == "gfc2"
    assert "GRPC_ENABLE_FORK_SUPPORT" not in env  # a worker node; only the head runs Ray's client proxy
    assert ClusterNode.of(0).env()["GRPC_ENABLE_FORK_SUPPORT"] == "0"


def test_the_recorded_cluster_reads_back_as_it_was_written():
    spec = ClusterSpec(3, "1gbit", {(0, 2): "200mbit"}, delay_ms=0.5, cpus=1)
    up = NamespaceCluster(spec, tuple(ClusterNode.of(i) for i in range(3)), "10.233.0.1:6379", "ray://10.233.0.1:10001")
    again = NamespaceCluster.from_json(json.loads(json.dumps(up.to_json())))
    assert again == up and again.spec.rate(2, 0) == "200mbit"
