import json

import pytest

from graphflow.workflow.evaluate import EvalRow, EvalSettings, GeneratorEval, _summarize


def _row(method: str, benchmark: str, task: int, f1: float, part: str = "loo") -> EvalRow:
    return EvalRow(part, method, benchmark, task, 2.0, 1.0, f1, 0.5, float(f1 == 1.0), 1.0)


def test_the_summary_scores_each_method_over_its_part_and_renders_as_before():
    rows = [_row("gnn", "GSM8K", 0, 1.0), _row("gnn", "MATH", 1, 0.5), _row("random", "GSM8K", 0, 0.0)]
    rows.append(_row("gnn", "GSM8K", 0, 0.25, part="recombination"))
    parts = _summarize(rows, EvalSettings(bootstrap=50))
    loo = parts["loo"]
    assert loo.benchmarks == ("GSM8K", "MATH") and loo.tasks == 2 and set(loo.methods) == {"gnn", "random"}
    assert loo.methods["gnn"].edge_f1 == pytest.approx(0.75) and loo.methods["gnn"].exact_match == 0.5
    lo, hi = loo.methods["gnn"].edge_f1_ci
    assert 0.5 <= lo <= hi <= 1.0
    assert parts["recombination"].methods["gnn"].edge_f1 == 0.25
    flat = json.loads(json.dumps(GeneratorEval(parts, tuple(rows)).to_json()))
    assert flat["loo"]["methods"]["gnn"]["edge_f1_ci"] == [lo, hi] and flat["loo"]["tasks"] == 2
    csv_rows = GeneratorEval(parts, tuple(rows)).csv_rows()
    assert list(csv_rows[0])[:6] == ["part", "method", "benchmark", "task", "ms", "upper_bound"]
