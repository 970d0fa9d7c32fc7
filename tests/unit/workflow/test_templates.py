from __future__ import annotations

import pytest

from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import load_corpus
from graphflow.workflow.templates import CONTRACTS, TEMPLATES, template_for, template_set
from graphflow.workflow.templates_detailed import DETAILED_TEMPLATES


def test_every_operation_has_a_short_and_a_detailed_template():
    assert set(TEMPLATES) == set(DETAILED_TEMPLATES) == set(CONTRACTS)
    for role, text in DETAILED_TEMPLATES.items():
        assert text.startswith("\n### Step:") and "{task}" not in text
        assert "Output format:" in text and "Worked example 1." in text and "Worked example 2." in text
        assert len(text) > 5 * len(TEMPLATES[role]), role


def test_template_sets_are_chosen_by_name_and_unknown_ones_refused():
    assert template_for("SOLVE") == TEMPLATES["SOLVE"]
    assert template_for("SOLVE", "detailed") == DETAILED_TEMPLATES["SOLVE"]
    with pytest.raises(ValueError, match="short, detailed"):
        template_set("long")
    with pytest.raises(ValueError, match="no template for operation role"):
        template_for("DANCE", "detailed")


def test_a_workflow_compiles_with_either_set():
    wf = load_corpus()[0]
    short, detailed = compile_workflow(wf), compile_workflow(wf, "detailed")
    assert [n.id for n in short.nodes] == [n.id for n in detailed.nodes]
    assert all(d.template == DETAILED_TEMPLATES[d.role] for d in detailed.nodes)
    assert all(s.template == TEMPLATES[s.role] for s in short.nodes)
