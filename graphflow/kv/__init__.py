"""KV state objects: block keys, blocks, states, packing to/from transformers caches, the block
store, and the KV-state manager with its catalog.

Import from the modules (``graphflow.kv.keys``, ``block``, ``state``, ``store``, ``packing``,
``codec``, ``manager``...): this package imports none of them, so the manager, its catalog,
events and plans load without torch (Ray's per-client servers on the head load the manager's
class and unpickle the records it returns; see ``runtime.replica_actor``).
"""
