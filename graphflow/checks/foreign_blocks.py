"""The ``bad-input`` scenario's foreign KV: blocks another model computed, sent to a replica.

``graphflow check faults`` asserts the replica refuses them with one clear error (the keys and
sizes of another model's blocks never match what its own model expects) and keeps serving.
"""

from __future__ import annotations

from graphflow.kv.codec import to_wire
from graphflow.kv.packing import cache_to_blocks
from graphflow.models.engine import Engine
from graphflow.runtime.actors import RayCluster
from graphflow.runtime.plan import NodePlan
from scheduler.policy import Option
from transport.base import TransferSpec, TransportConfig
from transport.ids import transfer_ids
from transport.registry import create

__all__ = ["send_foreign_blocks"]


def send_foreign_blocks(cluster: RayCluster, ids: list[int], timeout_s: float) -> None:
    """Tell the first replica to resume ``ids`` from a transfer of their full 16-token blocks,
    then send it KV blocks of those tokens computed by another model (tiny-qwen2): their keys
    and sizes disagree with what its own model expects. Raises what the replica's refusal raises."""
    c, r0 = cluster, cluster.replicas[0]
    other = Engine.load("tiny-qwen2")
    headers, tensors = to_wire(cache_to_blocks(other.prefill(ids).cache, ids, other.identity, 16))
    backend = getattr(c.deployment(), "transport", "ucx")
    driver = create(
        backend,
        TransportConfig(timeout_s=timeout_s),
        **({"name": "faults-driver"} if backend == "ray" else {}),
    )
    try:
        tid = next(transfer_ids())
        plan = NodePlan(
            "faults-foreign",
            (*ids, 65),
            2,
            Option.TRANSFER,
            receive=(0, len(ids) // 16 * 16),
            source_address=driver.address,
            transfer_id=tid,
        )
        node = c.call(r0, "run_node", plan)
        dst = c.get(c.call(r0, "address"))
        driver.send(TransferSpec.for_headers(tid, dst, headers), headers, tensors)
        c.get(node)
    finally:
        driver.close()
