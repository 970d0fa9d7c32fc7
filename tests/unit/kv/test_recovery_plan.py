from graphflow.kv.recovery_plan import plan_recovery

HELD = {10: ["r1"], 11: ["r1", "r0"], 12: ["r0"], 13: ["r2", "r0"], 14: [], 15: ["r1"]}


def _steps(replica, keys, tokens, block_tokens=4):
    plan = plan_recovery("s", replica, keys, tokens, block_tokens, lambda k: HELD[k], ("parent",))
    assert plan.lineage == ("parent",) and plan.state_id == "s" and plan.replica == replica
    return [(s.action, s.source, s.blocks, s.tokens) for s in plan.steps]


def test_runs_of_reuse_then_one_source_per_transfer_then_recompute_to_the_end():
    # block 15 is held on r1 again, but a prefill from block 14 on recomputes it anyway
    assert _steps("r1", [10, 11, 12, 13, 14, 15], 22) == [
        ("reuse", "r1", (0, 2), (0, 8)),
        ("transfer", "r0", (2, 4), (8, 16)),
        ("recompute", "", (4, 6), (16, 22)),
    ]


def test_a_transfer_run_ends_where_its_source_stops_holding():
    # r0 holds blocks 11-13; block 10 only on r1, so r2 takes two sources
    assert _steps("r2", [10, 11, 12, 13], 16) == [
        ("transfer", "r1", (0, 2), (0, 8)),
        ("transfer", "r0", (2, 3), (8, 12)),
        ("reuse", "r2", (3, 4), (12, 16)),
    ]


def test_no_blocks_no_steps():
    assert _steps("r0", [], 0) == []
