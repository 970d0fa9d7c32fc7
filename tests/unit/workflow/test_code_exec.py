from graphflow.workflow.code_exec import extract_code, run_solve


def test_fenced_block_is_extracted_and_solve_called_with_missing_args_as_none():
    text = "Here it is:\n```python\ndef solve(n):\n    return 964 + 494\n```\nThis function adds."
    code = extract_code(text)
    assert code is not None and "return 964 + 494" in code
    result = run_solve(code)
    assert result.ok and result.value == "1458"
    assert result.as_text() == "\nResult: 1458\n"


def test_unfenced_code_starts_at_the_first_def():
    assert extract_code("Sure.\ndef solve():\n    return 'x'") == "def solve():\n    return 'x'"
    assert extract_code("no code here at all") is None


def test_prints_are_not_mistaken_for_the_value():
    result = run_solve("def solve():\n    print('noise 7')\n    return 3\n")
    assert result.ok and result.value == "3"


def test_without_solve_the_printed_output_is_the_result():
    assert run_solve("print(6 * 7)").value == "42"


def test_errors_and_timeouts_are_reported_not_raised():
    bad = run_solve("def solve(:\n  pass")
    assert not bad.ok and "SyntaxError" in bad.error and bad.as_text().startswith("\nError: ")
    slow = run_solve("def solve():\n    while True:\n        pass\n", timeout_s=1.0)
    assert not slow.ok and slow.error == "timeout"
    assert run_solve(None).error == "no code"


def test_the_code_cannot_touch_this_process():
    marker = []
    run_solve("import sys\nsys.modules.clear()\ndef solve():\n    return 1\n")
    assert marker == [] and extract_code("```\nx = 1\n```") == "x = 1\n"


def test_the_result_says_whether_the_sandbox_limits_were_set():
    ok = run_solve("def solve():\n    return 6 * 7\n")
    assert ok.ok and ok.value == "42" and ok.unlimited == ""  # Linux sets both limits
    hog = run_solve("def solve():\n    return len(bytearray(2 << 30))\n")  # over the 1 GiB address-space limit
    assert not hog.ok and "MemoryError" in hog.error


def test_a_limit_that_could_not_be_set_is_reported_not_swallowed():
    from graphflow.workflow.code_exec import _limits

    why, lines = _limits("__GRAPHFLOW_LIMITS__ ValueError: not allowed\nTraceback\nZeroDivisionError: x\n")
    assert why == "ValueError: not allowed" and lines[-1] == "ZeroDivisionError: x"
