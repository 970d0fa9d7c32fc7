"""The served baselines on in-process replicas (the same executor and replica code)."""

import pytest

from graphflow.bench.serve import agents_graph
from graphflow.bench.systems import SYSTEMS, run_as

HOLDER_HERE = "replica-0"


@pytest.fixture(scope="module")
def served(local_client):
    return local_client.cluster, local_client.executor


def test_each_system_runs_the_same_agents_and_the_baselines_move_nothing(served):
    cluster, ex = served
    graph = agents_graph(4)
    encode = cluster.workers[HOLDER_HERE].encode
    roots = {s: encode(f"{s}: a shared context the agents all continue. " * 40) for s in SYSTEMS}  # fresh each
    got = {s: run_as(s, ex, graph, roots[s], cluster.replicas, HOLDER_HERE) for s in SYSTEMS}
    # exact mode: the same tokens as a run with reuse off, whatever each system did with the KV
    for s in SYSTEMS:
        assert got[s].outputs == ex.run(graph, roots[s], f"check-{s}", reuse=False).outputs
    assert {t.decision for t in got["dense"].nodes} == {"recompute"}
    for s in ("local", "routed", "holder"):
        assert got[s].bytes_moved == 0 and "transfer" not in {t.decision for t in got[s].nodes}
    assert {t.replica for t in got["holder"].nodes} == {HOLDER_HERE}
    assert {t.decision for t in got["holder"].nodes} == {"reuse"}
    # round robin: agent j on replica j mod 2, and the second replica holds no prefix of its own
    where = {t.node: t.replica for t in got["local"].nodes}  # NOTE: traces come in finishing order
    assert [where[f"agent-{j}"] for j in range(4)] == ["replica-0", "replica-1"] * 2
    assert {t.decision for t in got["local"].nodes if t.replica == "replica-1"} == {"recompute"}


def test_an_unknown_system_is_refused(served):
    cluster, ex = served
    with pytest.raises(ValueError, match="unknown system 'vllm'"):
        run_as("vllm", ex, agents_graph(1), [1, 2, 3], cluster.replicas, HOLDER_HERE)
