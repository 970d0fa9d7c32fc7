"""The TTFT study's ``--served`` settings (no deployment started)."""

import argparse

import pytest

from experiments.ttft.run import CAPACITY_MIB, QUICK_CAPACITY_MIB, served_settings


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
