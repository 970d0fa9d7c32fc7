"""What a node is offered on each replica, from one manager lookup (no Ray)."""

from __future__ import annotations

from graphflow.kv.events import NodeLookup, PrefixMatch, TemplateHolding
from graphflow.runtime.offers import arriving_tokens, residual_copy, state_requests
from graphflow.runtime.plan import TemplateRef
from scheduler.cost import LinkSpec
from scheduler.policy import StateRequest

NO_TEMPLATE = TemplateRef("", (), 0)


def _link(src: str, dst: str) -> LinkSpec:
    return LinkSpec("ucx", 1e9, 1e-4, src, dst)


def _requests(
    look: NodeLookup,
    context: int = 100,
    replicas: tuple[str, ...] = ("a", "b", "c"),
    live: tuple[str, ...] = ("a", "b", "c"),
    transfers: bool = True,
    arriving: dict[str, int] | None = None,
) -> dict[str, StateRequest]:
    got = state_requests(
        look, context, NO_TEMPLATE, replicas, live, 16, 1000, _link, lambda r: f"addr-{r}", transfers, arriving
    )
    return {r.replica: r for r in got}


def test_prefixes_count_in_whole_blocks_and_leave_the_last_token() -> None:
    look = NodeLookup((), (PrefixMatch("a", 7, 100), PrefixMatch("b", 2, 40)), None)
    got = _requests(look, context=100)
    assert got["a"].local_tokens == 96  # 99 usable tokens, in whole blocks of 16
    assert got["b"].local_tokens == 32
    assert got["c"].local_tokens == 0


def test_longer_copies_elsewhere_are_offered_with_their_link_and_address() -> None:
    look = NodeLookup((), (PrefixMatch("a", 6, 96), PrefixMatch("b", 2, 32)), None)
    got = _requests(look)
    assert [(c.replica, c.tokens, c.address) for c in got["c"].remote] == [("a", 96, "addr-a"), ("b", 32, "addr-b")]
    assert [c.replica for c in got["b"].remote] == ["a"]  # only copies longer than its own
    assert got["a"].remote == ()
    assert got["c"].remote[0].link.src == "a" and got["c"].remote[0].link.dst == "c"


def test_no_copies_without_transfers_or_from_a_replica_no_longer_live() -> None:
    look = NodeLookup((), (PrefixMatch("a", 6, 96),), None)
    assert _requests(look, transfers=False)["b"].remote == ()
    assert _requests(look, live=("b", "c"))["b"].remote == ()


def test_a_pinned_node_gets_one_request_and_still_sees_copies_on_the_others() -> None:
    look = NodeLookup((), (PrefixMatch("a", 6, 96),), None)
    got = _requests(look, replicas=("b",))
    assert list(got) == ["b"] and [c.replica for c in got["b"].remote] == ["a"]


def test_arriving_tokens_are_local_where_they_land_and_never_a_source() -> None:
    look = NodeLookup((), (PrefixMatch("a", 2, 32),), None)
    got = _requests(look, arriving={"b": 80})
    assert got["b"].local_tokens == 80
    assert [c.replica for c in got["c"].remote] == ["a"]  # b holds none of them yet


def test_arriving_tokens_are_the_transfers_bringing_a_prefix_of_this_context() -> None:
    ctx = list(range(50))
    moving = {"a": tuple(range(20)), "b": tuple(range(1, 21)), "c": tuple(range(50))}
    assert arriving_tokens(ctx, moving) == {"a": 20}  # b: another context; c: not a strict prefix


def test_a_template_is_rebuilt_but_its_last_token_and_only_at_its_length() -> None:
    tmpl = TemplateRef("REVIEW", ("PLAN",), 30)
    holding = TemplateHolding("REVIEW", ("PLAN",), "v1", 30, 4096, recompute=12)
    got = residual_copy(holding, 100, tmpl)
    assert got is not None and (got.tokens, got.start, got.recompute, got.nbytes) == (29, 70, 12, 4096)
    assert residual_copy(holding, 100, TemplateRef("REVIEW", ("PLAN",), 31)) is None
    assert residual_copy(holding, 30, tmpl) is None  # the whole context: nothing before it to continue
    assert residual_copy(None, 100, tmpl) is None
    look = NodeLookup((), (), None, (("b", holding),))
    requests = state_requests(look, 100, tmpl, ("a", "b"), ("a", "b"), 16, 1000, _link, str)
    assert [r.residual is not None for r in requests] == [False, True]
