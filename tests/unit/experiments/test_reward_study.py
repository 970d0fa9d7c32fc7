import re

import pytest

from experiments.generator_eval.reward import signature, single_op
from experiments.generator_eval.reward_tasks import Task, make_tasks, score


def test_tasks_are_seeded_and_splits_use_disjoint_countries():
    a, b = make_tasks("train", 6, 0), make_tasks("train", 6, 0)
    assert a == b and len(a) == 12
    assert {t.family for t in a} == {"arithmetic", "capital"}
    for t in a:
        if t.family == "arithmetic":
            a, op, b = re.search(r"(\d+) ([-+*]) (\d+)", t.text).groups()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(t.answer)
    train = {t.answer for t in make_tasks("train", 40, 1) if t.family == "capital"}
    test = {t.answer for t in make_tasks("test", 40, 1) if t.family == "capital"}
    assert train and test and not train & test
    with pytest.raises(ValueError, match="split"):
        make_tasks("dev", 2, 0)


def test_arithmetic_prefers_the_executed_result_over_other_numbers():
    t = Task("arithmetic", "What is 2 + 3?", "5")
    assert score(t, "def solve():\n    return 2 + 3\nResult: 5\n") == 1.0
    assert score(t, "2 + 3 = 5, then times 2 is 10") == 0.0
    assert score(t, "The answer is 5.") == 1.0
    assert score(t, "Result: 1,005\n") == 0.0


def test_capital_needs_the_whole_word():
    t = Task("capital", "What is the capital of Italy?", "Rome")
    assert score(t, "The capital is rome.") == 1.0
    assert score(t, "Romeo") == 0.0


def test_signature_of_a_single_operation():
    assert signature(single_op("Programmer", "PROGRAM")) == "TASK@-1>PROGRAM@0"


def test_synthetic_reward_is_fixed_per_task_and_workflow_and_follows_the_family_rates():
    from experiments.generator_eval.reward_sim import synthetic_success

    program, solve = single_op("Custom", "PROGRAM"), single_op("Custom", "SOLVE")
    tasks = [f"What is {a} + 7?" for a in range(200)]
    draws = [synthetic_success("arithmetic", t, program) for t in tasks]
    assert draws == [synthetic_success("arithmetic", t, program) for t in tasks]
    assert 0.55 < sum(draws) / len(draws) < 0.75  # RATES: PROGRAM answers 0.65 of arithmetic
    assert not any(synthetic_success("arithmetic", t, solve) for t in tasks)
    capitals = [synthetic_success("capital", f"What is the capital of country {i}?", solve) for i in range(200)]
    assert 0.3 < sum(capitals) / len(capitals) < 0.5
