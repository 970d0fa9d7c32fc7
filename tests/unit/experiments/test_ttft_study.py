"""The TTFT study's ``--served`` settings (no deployment started)."""

import argparse

import pytest

from experiments.ttft.run import CAPACITY_MIB, QUICK_CAPACITY_MIB, served_row, served_settings, served_table


def _args(**kw):
    base = {"quick": False, "models": None, "contexts": None, "repeats": 2, "suffix": 64, "capacity_mib": 0}
    return argparse.Namespace(**(base | kw))


def test_a_quick_served_run_takes_the_quick_sizes_and_a_small_store():
    assert served_settings(_args(quick=True)) == (["smollm2-135m"], [256, 1024], 1, QUICK_CAPACITY_MIB)
    assert served_settings(_args(quick=True, capacity_mib=512))[3] == 512


def test_a_full_served_run_keeps_three_repeats_at_least_and_its_sizes():
    assert served_settings(_args()) == (["smollm2-135m"], [1024, 4096], 3, CAPACITY_MIB)
    got = served_settings(_args(models="qwen2-0.5b-shape,smollm2-135m", contexts="1024,16384", repeats=5))
    assert got == (["qwen2-0.5b-shape", "smollm2-135m"], [1024, 16384], 5, CAPACITY_MIB)


def test_bad_served_settings_say_what_is_wrong():
    with pytest.raises(SystemExit, match="contexts of at least 16 tokens"):
        served_settings(_args(contexts="8"))
    with pytest.raises(SystemExit, match="no-such-model"):
        served_settings(_args(models="no-such-model"))


def _served(**kw):
    return {
        "context": 4096,
        "suffix": 64,
        "decision": "transfer",
        "served_bytes": 200_000_000,
        "served_same_first_token": True,
        "served_s": 0.50,
        "served_replica_s": 0.46,
        "served_decide_s": 0.007,
        "served_dense_s": 16.0,
        "served_lookup_s": 0.0,
        "served_receive_s": 0.03,
        "served_rebuild_s": 0.01,
        "served_prefill_s": 0.40,
    } | kw


def test_the_served_bound_is_the_served_prefill_plus_the_bytes_at_the_runs_raw_speed():
    scripted = {"ours_s": 0.55, "local_s": 20.0, "dense_s": 15.0, "raw_bandwidth_bytes_per_s": 10e9}
    row = served_row("m", _served(), scripted)
    assert row["served_bound_s"] == pytest.approx(0.40 + 0.02)  # 200 MB at 10 GB/s
    assert row["served_omega_s"] == pytest.approx(0.50 - 0.42)
    assert row["served_over_bound"] == pytest.approx(0.50 / 0.42)
    assert row["raw_bandwidth_bytes_per_s"] == 10e9
    text = served_table([row])
    assert "| 0.420 | 1.19 | 80.0 |" in text and "m 10.00" in text


def test_a_served_row_refuses_a_raw_bandwidth_that_was_not_measured():
    scripted = {"ours_s": 0.55, "local_s": 20.0, "dense_s": 15.0, "raw_bandwidth_bytes_per_s": 0.0}
    with pytest.raises(ValueError, match="raw bandwidth must be positive"):
        served_row("m", _served(), scripted)
