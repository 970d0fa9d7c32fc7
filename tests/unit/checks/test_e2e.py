"""The e2e check's comparison on in-process replicas (the same executor and replica code)."""

import json

import pytest

from graphflow.checks.e2e import run_e2e_check


@pytest.fixture(scope="module")
def client(local_client):
    return local_client


def test_the_check_compares_reuse_on_with_off_and_passes_on_identical_outputs(client):
    result, on = run_e2e_check(client, branches=2, context_repeats=3)
    c = result.comparison
    assert result.passed == c.outputs_identical is True
    assert c.nodes == len(on.nodes) == 4  # two branches, their merge and the answer
    assert c.prefill_tokens_reuse == on.prefill_tokens < c.prefill_tokens_no_reuse
    assert c.prefill_tokens_saved == on.prefill_tokens_saved and c.root_prefill_tokens > 0
    assert set(c.replicas_used) <= set(client.cluster.replicas) and c.decisions["ROOT"] == "materialize"
    flat = json.loads(json.dumps(result.to_json()))
    assert flat["outputs_identical"] is True and flat["branches"] == 2 and flat["replicas"] == 2
    assert flat["replicas_used"] == list(c.replicas_used) and flat["transport"] == "local"


def test_bad_sizes_are_refused(client):
    with pytest.raises(ValueError, match="at least 1"):
        run_e2e_check(client, branches=0, context_repeats=3)
