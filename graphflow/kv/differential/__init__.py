"""Differential KV (GraphFlow, DESIGN.md §2): each operation's template KV stored once as a
prefix-free *base* plus sparse *residuals* for hot prefix paths; cold paths are pruned and
recomputed.

* ``base`` — the base and the dense residual of an exact execution;
* ``codecs`` — how residuals are stored (dense, sparse per row, sink tokens);
* ``store`` — bases and residuals per operation and path (``DifferentialKV``, ``KVMode``);
* ``recompute`` — rebuilding a template after a prefix, with selective recompute;
* ``paths`` — path keys and how often each is seen;
* ``template_kv`` — a replica's differential template KV (``TemplateKV``).
"""
