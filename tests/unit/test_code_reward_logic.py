"""Pure parts of the code reward: test parsing, output comparison, program extraction."""

import pytest

from runtime.rewards.code import (
    TestSpecError,
    extract_program,
    outputs_match,
    parse_tests,
    values_match,
)


def test_parse_apps_styles_and_scripts():
    stdio = parse_tests('{"inputs": ["1\\n"], "outputs": ["2\\n"]}')
    assert (stdio.kind, stdio.total) == ("stdio", 1)
    call = parse_tests({"fn_name": "f", "inputs": [[1], [2]], "outputs": [[1], [2]]})
    assert (call.kind, call.fn_name, call.total) == ("call", "f", 2)
    he = parse_tests({"test": "def check(c): assert c(1)", "entry_point": "g"})
    assert he.kind == "script" and he.script.endswith("check(g)\n")
    mbpp = parse_tests(
        {"test_list": ["assert h(1) == 2", "assert h(2) == 3"], "test_setup_code": "import os"}
    )
    assert (mbpp.kind, mbpp.total, mbpp.script) == ("asserts", 2, "import os")
    assert (
        mbpp.subset([1]).inputs == ["assert h(2) == 3"] and mbpp.subset([1]).script == "import os"
    )
    assert parse_tests(["assert 1"]).kind == "asserts"
    assert parse_tests("assert True").kind == "script"
    assert call.subset([1]).inputs == [[2]]


@pytest.mark.parametrize(
    "tests, message",
    [
        ('{"inputs": [', "not valid JSON"),
        ({"inputs": ["1"], "outputs": []}, "1 inputs but 0 outputs"),
        ({"inputs": [], "outputs": []}, "no test cases"),
        ({"inputs": "1", "outputs": "2"}, "must be lists"),
        ({"fn_name": "a b", "inputs": [[1]], "outputs": [1]}, "not a Python identifier"),
        ({"cases": []}, "need 'inputs' and 'outputs'"),
        (5, "expected an object"),
        ({"test_list": [1]}, "list of strings"),
        ([], "no test cases"),
    ],
)
def test_bad_tests_are_one_line(tests, message):
    with pytest.raises(TestSpecError, match=message) as info:
        parse_tests(tests)
    assert "\n" not in str(info.value)


def test_outputs_match_like_apps():
    assert outputs_match("1\n6\n-1\n", "1\n6\n-1")
    assert outputs_match("1 \n6\n\n", "1\n6\n")  # trailing whitespace and blank lines
    assert outputs_match("0.3333333", "0.33333333")  # float tolerance
    assert outputs_match("1 2\n3", "1\n2 3")  # token-wise fallback
    assert not outputs_match("1\n6\n", "1\n7\n")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("", "0")
    assert not outputs_match("YES", "Yes")


def test_values_match_handles_apps_wrapping_and_floats():
    assert values_match(9, [9]) and values_match(9, 9)
    assert values_match([1, 2], [1, 2]) and values_match([[1, 2]], [[1, 2]])
    assert values_match(0.1 + 0.2, 0.3)
    assert not values_match(True, [False]) and not values_match([1], [1, 2])
    assert not values_match("9", 9)


def test_extract_program_prefers_the_last_python_block():
    text = "think\n```\nnot this\n```\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```"
    assert extract_program(text) == "print(2)\n"
    assert extract_program("```\nx = 1\n```") == "x = 1\n"
    assert extract_program("print(3)") == "print(3)"
