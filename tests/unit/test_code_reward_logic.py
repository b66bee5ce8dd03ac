"""Pure parts of the code reward: test parsing, output comparison, program extraction."""

import pytest

from runtime.workloads.rewards.code import (
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
    assert outputs_match("0.3333333", "0.33333333", 1e-6)  # the problem's stated tolerance
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


def test_integers_compare_exactly_and_tolerance_is_for_decimals_only():
    assert not outputs_match("1000001", "1000000")  # 1e-6 relative would have let it in
    assert not outputs_match("1000001\n", "1000000.0\n")  # an integer on one side: exact
    assert outputs_match("2", "2.0") and not outputs_match("+7", "7")
    assert not outputs_match("1000000.4", "1000000.0")  # no tolerance stated: exact
    assert outputs_match("1000000.4", "1000000.0", 1e-6)  # both decimals: the tolerance
    assert not values_match(3.0, "3") and not values_match("3", 3.0)
    assert not values_match(True, 1) and not values_match(1, True)
    assert not values_match(1000001, 1000000) and not values_match(1000001.0, 1000000)
    assert values_match(2, 2.0) and values_match((1, 2), [1, 2])
    assert values_match({"a": [1.0000000001]}, {"a": [1.0]})


def test_only_exact_plain_types_cross_the_boundary():
    import collections

    from runtime.workloads.rewards.code.plain import _decode, _encode, _NotPlain

    plain = [
        None,
        True,
        -(10**30),
        1.5,
        float("nan"),
        "s",
        b"\x00",
        (1, [2, {3: frozenset({4})}]),
        {"k": {5, 6}},
        collections.Counter("aab"),
        collections.deque([1], maxlen=3),
        collections.defaultdict(list, {1: [2]}),
    ]
    for v in plain:
        back = _decode(_encode(v))
        assert type(back) is type(v) and (back == v or v != v), v

    class Str(str):
        pass

    class Yes:
        def __eq__(self, other: object) -> bool:
            return True

    nested: list = []
    nested.append(nested)
    for bad in (Str("x"), Yes(), [Yes()], {1: Yes()}, nested, iter([1]), lambda: 1):
        with pytest.raises(_NotPlain):
            _encode(bad)


def test_the_names_that_stand_for_the_program():
    from runtime.workloads.rewards.code import program_names

    test = (
        "def check(candidate):\n"
        "    lst = list(range(-9, 10, 2))\n"
        "    odd_sum = sum([i**2 for i in lst if i > 0])\n"
        "    assert candidate(lst) == odd_sum\n"
        "\ncheck(f)\n"
    )
    names = program_names(test, {"f", "sum"}, "f")
    assert names == ["f"]  # the entry point; a builtin the program shadows stays real
    # with no entry point (MBPP) a builtin the program defines is the function under test
    # when nothing else in the test can be
    assert program_names("assert sum(10, 15) == 6\n", {"sum"}, None) == ["sum"]
    # a name a test star-imports from the standard library is the test's
    assert program_names("from math import *\nassert f(2) == comb(4, 2)\n", set(), None) == ["f"]


def test_a_builtin_the_program_redefines_is_not_the_program_beside_another_name():
    from runtime.workloads.rewards.code import program_names

    test = "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"
    names = program_names(test, {"set", "similar_elements"}, None)
    assert names == ["similar_elements"]
    # also a name the program never defines (it may be missing): it is what is tested
    assert program_names("assert abs(area(2) - 12.566) < 0.01\n", {"abs"}, None) == ["area"]
    # two shadowed builtins and nothing else: neither is taken for the program's
    assert program_names("assert sum(10, 15) == int('6')\n", {"sum", "int"}, None) == []
    # with an entry point, only it and non-builtin names are the program's
    script = "def check(candidate):\n    assert len(candidate(1)) == len([1])\n\ncheck(f)\n"
    assert program_names(script, {"len", "f"}, "f") == ["f"]
