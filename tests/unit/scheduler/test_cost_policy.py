from __future__ import annotations

import numpy as np
import pytest

from scheduler.calibrate import Profile, fit_link, fit_prefill, load_profile, save_profile
from scheduler.cost import LinearCost, LinkSpec, PrefillModel, t_prefill, t_prefill_suffix, t_transfer
from scheduler.eviction import eviction_order, eviction_scores
from scheduler.policy import (
    Option,
    Policy,
    RemoteCopy,
    ResidualCopy,
    StateRequest,
    decide,
    place,
    prediction_error,
    prefill_work_s,
    recompute,
    regret,
)

PM = PrefillModel(a=0.01, b=1e-4, c=1e-8)
FAST = LinkSpec("ucx", 4e9, 50e-6)
SLOW = LinkSpec("tcp", 1e6, 1e-3)


def test_cost_functions_hand_computed():
    assert t_prefill(PM, 1000) == pytest.approx(0.01 + 0.1 + 0.01)
    assert t_prefill(PM, 0) == 0.0
    assert t_prefill_suffix(PM, 1000, 1500) == pytest.approx(0.01 + 0.05 + 1e-8 * (1500**2 - 1000**2))
    assert t_transfer(4_000_000, FAST) == pytest.approx(1e-3 + 50e-6)
    assert t_transfer(0, FAST) == 0.0
    assert LinearCost(0.002, 1e-9)(1_000_000) == pytest.approx(0.003)


def test_costs_are_monotone():
    ts = [t_prefill(PM, n) for n in (1, 10, 100, 1000, 10000)]
    assert ts == sorted(ts)
    xs = [t_transfer(n, SLOW) for n in (1, 10, 10**6)]
    assert xs == sorted(xs)
    assert t_prefill_suffix(PM, 500, 1000) < t_prefill(PM, 1000)


def test_bad_links_and_models_are_refused():
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        LinkSpec("ucx", 0.0, 1e-5)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        LinkSpec("ucx", -5.0, 1e-5)
    with pytest.raises(ValueError, match="non-negative"):
        PrefillModel(0.0, -1.0, 0.0)


def _req(**kw):
    base = dict(replica="r0", total_tokens=4096, kv_bytes_per_token=12288)
    base.update(kw)
    return StateRequest(**base)


def test_policy_picks_each_option_where_it_is_right():
    pol = Policy(PM, resume=LinearCost(1e-3, 1e-10), reconstruct=LinearCost(2e-3, 1e-10))
    # all KV local: reuse
    assert decide(_req(local_tokens=4096), pol).option is Option.REUSE
    # KV on a fast link: transfer beats prefill of 4096 tokens (~0.59 s)
    assert decide(_req(remote=(RemoteCopy("r1", 4096, FAST),)), pol).option is Option.TRANSFER
    # KV only over a very slow link, a base+residual here: reconstruct
    d = decide(_req(remote=(RemoteCopy("r1", 4096, SLOW),), residual=ResidualCopy(4000, 10_000_000)), pol)
    assert d.option is Option.RECONSTRUCT
    # recomputing the template's head costs like a suffix of that many tokens
    plain = decide(_req(residual=ResidualCopy(4000, 10_000_000)), pol).predicted_s[Option.RECONSTRUCT]
    headed = decide(_req(residual=ResidualCopy(4000, 10_000_000, recompute=12)), pol).predicted_s[Option.RECONSTRUCT]
    assert headed - plain == pytest.approx(t_prefill_suffix(PM, 0, 12))
    with pytest.raises(ValueError, match="recompute"):
        ResidualCopy(10, 100, recompute=11)
    # nothing anywhere: recompute; and an incompatible state only allows recompute
    assert decide(_req(), pol).option is Option.RECOMPUTE
    d = decide(_req(local_tokens=4096, compatible=False, reason="config hash differs"), pol)
    assert (
        d.option is Option.RECOMPUTE and d.reason == "config hash differs" and set(d.predicted_s) == {Option.RECOMPUTE}
    )
    # a slow link loses to recompute: 50 MB at 1 MB/s = 50 s
    assert decide(_req(remote=(RemoteCopy("r1", 4096, SLOW),)), pol).option is Option.RECOMPUTE


def test_decision_carries_what_the_replica_executes():
    pol = Policy(PM, resume=LinearCost(1e-3, 1e-10), reconstruct=LinearCost(2e-3, 1e-10))
    # a transfer prices, and names, only the blocks past the destination's own prefix
    d = decide(_req(local_tokens=1024, remote=(RemoteCopy("r1", 4000, FAST, "addr-1"),)), pol)
    assert d.option is Option.TRANSFER and d.receive == (1024, 4000) and d.source_address == "addr-1"
    assert d.predicted_s[Option.TRANSFER] == pytest.approx(
        t_transfer(2976 * 12288, FAST) + pol.resume(2976 * 12288) + t_prefill_suffix(PM, 4000, 4096)
    )
    assert d.prefill_tokens == 96 and d.new_bytes[Option.TRANSFER] == (4096 - 1024) * 12288
    # a template span at the context's end: prefix reused, span rebuilt, the rest prefilled
    res = ResidualCopy(290, 50_000, recompute=4, start=3796, op="SOLVE", path=("A",))
    d = decide(_req(local_tokens=3796, residual=res), pol)
    expected = pol.reconstruct(50_000) + t_prefill_suffix(PM, 3796, 3800) + t_prefill_suffix(PM, 4086, 4096)
    assert d.predicted_s[Option.RECONSTRUCT] == pytest.approx(expected)
    assert d.option is Option.RECONSTRUCT and d.residual == res and d.local_tokens == 3796
    assert d.prefill_tokens == 4096 - 290 + 4
    # a short template after the same prefix: two prefill calls cost more than one, so reuse
    short = ResidualCopy(29, 50_000, recompute=4, start=4066)  # the last token is prefilled
    assert decide(_req(local_tokens=4066, residual=short), pol).option is Option.REUSE
    assert decide(_req(local_tokens=4096), pol).receive == (0, 0)


def test_memory_term_can_flip_the_choice():
    # r1 can fetch the whole context fast; r0 holds a quarter of it and adds fewer new bytes
    here = _req(replica="r0", local_tokens=1024)
    there = _req(replica="r1", remote=(RemoteCopy("r0", 4096, FAST),))
    assert place([here, there], {}, Policy(PM, lam_s_per_byte=0.0)).replica == "r1"
    d = place([here, there], {}, Policy(PM, lam_s_per_byte=1e-6))
    assert d.replica == "r0" and d.option is Option.REUSE


def test_placement_weighs_locality_against_queue():
    pol = Policy(PM)
    here = _req(replica="r0", local_tokens=4096)
    there = _req(replica="r1")
    assert place([here, there], {}, pol).replica == "r0"
    assert place([here, there], {"r0": 5.0}, pol).replica == "r1"


def test_prefill_work_is_the_suffix_each_option_prefills():
    pol = Policy(PM)
    reuse = decide(_req(replica="r0", total_tokens=5000, local_tokens=4096), pol)
    assert reuse.option is Option.REUSE
    assert prefill_work_s(reuse, pol) == pytest.approx(t_prefill_suffix(PM, 4096, 5000))
    assert t_prefill_suffix(PM, 4096, 5000) < t_prefill(PM, 5000)
    moved = decide(_req(total_tokens=5000, remote=(RemoteCopy("r1", 4096, FAST),)), pol)
    assert moved.option is Option.TRANSFER  # the transfer itself is not the replica's compute
    assert prefill_work_s(moved, pol) == pytest.approx(t_prefill_suffix(PM, 4096, 5000))
    full = recompute("r0", 5000, 2, pol, "reuse off")
    assert prefill_work_s(full, pol) == pytest.approx(t_prefill(PM, 5000))


def test_regret_and_prediction_error():
    pol = Policy(PM)
    d = decide(_req(remote=(RemoteCopy("r1", 4096, FAST),)), pol)
    rec = d.with_measured(0.2, {Option.TRANSFER: 0.2, Option.RECOMPUTE: 0.1})
    assert regret([rec]) == pytest.approx(1.0)
    assert prediction_error([rec])[0] == pytest.approx(abs(d.chosen_predicted_s - 0.2) / 0.2)


def test_fits_recover_known_parameters(tmp_path):
    lengths = [128, 256, 512, 1024, 2048, 4096]
    fit = fit_prefill([(n, t_prefill(PM, n)) for n in lengths], "m")
    for n in (300, 3000, 8000):
        assert t_prefill(fit, n) == pytest.approx(t_prefill(PM, n), rel=1e-6)
    link = fit_link([(n, t_transfer(n, FAST)) for n in (1 << 20, 1 << 24, 1 << 26)], "ucx")
    assert link.bandwidth_bytes_per_s == pytest.approx(4e9, rel=1e-6)
    assert link.latency_s == pytest.approx(50e-6, rel=1e-4)
    prof = Profile("m", "abc", 12288, fit, LinearCost(1e-3, 1e-10), {"ucx": link}, LinearCost(2e-4, 3e-11))
    save_profile(tmp_path / "p.json", prof)
    assert load_profile(tmp_path / "p.json", "m", "abc") == prof
    unmeasured = Profile("m", "abc", 12288, fit, LinearCost(1e-3, 1e-10))
    save_profile(tmp_path / "u.json", unmeasured)
    assert load_profile(tmp_path / "u.json").reconstruct is None
    with pytest.raises(ValueError, match="calibrated for 'm', not 'other'"):
        load_profile(tmp_path / "p.json", "other")
    with pytest.raises(ValueError, match="no profile"):
        load_profile(tmp_path / "none.json")
    with pytest.raises(ValueError, match="no measured 'mpi' link"):
        prof.link("mpi")
    with pytest.raises(ValueError, match="three or more"):
        fit_prefill([(1, 1.0), (2, 2.0)])


def test_eviction_scores():
    hits, size, age = np.array([5, 0, 0]), np.array([1 << 20] * 3), np.array([1.0, 1.0, 100.0])
    s = eviction_scores(hits, size, age)
    assert list(eviction_order(s, np.array([True, True, True]))) == [2, 1, 0]
    soon = eviction_scores(hits, size, age, steps_until_next_use=np.array([-1, -1, 2]))
    assert list(eviction_order(soon, np.array([True, True, True]))) == [1, 0, 2]
    assert list(eviction_order(s, np.array([True, False, True]))) == [2, 0]


def test_force_takes_the_option_where_possible_and_still_prices_every_option():
    from scheduler.cost import LinkSpec, PrefillModel
    from scheduler.policy import Option, Policy, RemoteCopy, StateRequest, decide

    pol = Policy(PrefillModel(0.0, 1e-6, 0.0))  # prefill nearly free: recompute wins unforced
    slow = LinkSpec("slow", 1e3, 1e-3)
    req = StateRequest("b", 512, 1000, remote=(RemoteCopy("a", 512, slow, "addr-a"),))
    free = decide(req, pol)
    forced = decide(req, pol, force=Option.TRANSFER)
    assert free.option is Option.RECOMPUTE and forced.option is Option.TRANSFER
    assert forced.predicted_s == free.predicted_s and "forced" in forced.reason
    assert forced.source == "a" and forced.receive == (0, 512)
    # an option that is not possible (no local prefix to reuse) is not forced
    assert decide(req, pol, force=Option.REUSE).option is Option.RECOMPUTE
