import json

from experiments.results import section
from graphflow.bench.multi_agent import MultiAgentReport, MultiAgentRow


def _row(system: str, k: int, makespan: float, mib: int) -> MultiAgentRow:
    return MultiAgentRow(system, k, 512, 1.0, makespan - 1.0, makespan, 4 * k, 0, {"reuse": k}, 1, mib << 20)


def _write(folder, name: str, result: dict, **meta) -> None:
    folder.mkdir(parents=True)
    (folder / name).write_text(json.dumps(result))
    (folder / "meta.json").write_text(json.dumps({"git_sha": "abcdef0123", "git_dirty": False, **meta}))


def test_results_come_from_the_served_runs_with_their_commit(tmp_path):
    rows = (_row("ours", 4, 10.0, 100), _row("ideal", 4, 9.0, 90), _row("dense", 4, 40.0, 400))
    rows += (_row("local", 4, 30.0, 150), _row("holder", 4, 12.0, 120))
    report = MultiAgentReport(rows, 1, "ucx").to_json()
    _write(tmp_path / "multi_agent" / "results" / "served", "bench_multi_agent.json", report)
    memory = tmp_path / "peak_memory" / "results" / "served"
    _write(memory, "bench_peak_memory.json", report, from_multi_agent="1234567")
    serve = [
        {"workflows": 16, "system": "ours", "batching": True, "tokens_per_s": 60.0},
        {"workflows": 16, "system": "ours", "batching": False, "tokens_per_s": 20.0},
        {"workflows": 16, "system": "dense", "batching": True, "tokens_per_s": 15.0},
        {"workflows": 16, "system": "routed", "batching": True, "tokens_per_s": 30.0},
        {"workflows": 16, "system": "holder", "batching": True, "tokens_per_s": 40.0},
    ]
    _write(tmp_path / "throughput" / "results" / "served", "bench_serve.json", {"rows": serve})
    text = section(tmp_path)
    assert "TTFT of an agent" in text and "not measured yet through the served path" in text  # no ttft run here
    assert "| 4 | 10.00 | 9.00 | 0.900 | 40.00 | 12.00 (holder) | 1.20 |" in text
    assert "| 4 | 100 | 400 | 120 (holder) | 0.25 |" in text
    assert "--from-multi-agent`, at abcdef0 on a clean tree; reduced from the multi-agent run at 1234567" in text
    assert "| 16 | 60.0 | 20.0 | 15.0 | 40.0 (holder) | 4.00 | 1.50 |" in text


def test_the_ttft_command_names_the_models_and_contexts_its_run_measured(tmp_path):
    folder = tmp_path / "ttft" / "results" / "served"
    folder.mkdir(parents=True)
    header = "model,context,suffix,decision,served_bytes,served_s,served_dense_s,served_dense_over_served"
    (folder / "served.csv").write_text(header + "\nqwen2-0.5b-shape,16384,64,transfer,201326592,1.4,131.0,93.6\n")
    meta = {"git_sha": "abcdef0123", "git_dirty": False, "models": ["qwen2-0.5b-shape"], "contexts": [1024, 16384]}
    (folder / "meta.json").write_text(json.dumps(meta))
    text = section(tmp_path)
    command = "python -m experiments.ttft.run --served --models qwen2-0.5b-shape --contexts 1024,16384"
    assert f"`{command}`, at abcdef0" in text
    assert "| qwen2-0.5b-shape | 16384 | 64 | transfer | 201,326,592 | 1.400 | 131.00 | 93.6 |" in text
