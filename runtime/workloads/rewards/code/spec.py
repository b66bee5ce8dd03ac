"""What is graded: the tests, parsed from the four styles the public datasets write
(:func:`parse_tests`), and the program, taken from a model's response
(:func:`extract_program`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


class TestSpecError(ValueError):
    """Tests that cannot be run; the message is one line naming the problem."""


@dataclass(frozen=True)
class TestSpec:
    kind: str  # stdio | call | script | asserts
    inputs: list[Any] = field(default_factory=list)  # asserts: the assert lines
    outputs: list[Any] = field(default_factory=list)
    fn_name: str | None = None  # call: the function; script: the entry point, when given
    script: str = ""  # script: the test code; asserts: the setup code

    @property
    def total(self) -> int:
        return 1 if self.kind == "script" else len(self.inputs)

    def subset(self, indices: list[int]) -> TestSpec:
        if self.kind == "script":
            return self
        return TestSpec(
            self.kind,
            [self.inputs[i] for i in indices],
            [self.outputs[i] for i in indices],
            self.fn_name,
            self.script,
        )


def parse_tests(obj: Any, *, fn_name: str | None = None) -> TestSpec:
    """A TestSpec from an APPS ``input_output`` (dict or JSON string), a HumanEval-style
    ``{"test", "entry_point"?}``, an MBPP-style ``{"test_list", "test_setup_code"?}``, or a
    test script string."""
    if isinstance(obj, list):
        obj = {"test_list": obj}
    if isinstance(obj, str):
        text = obj.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TestSpecError(f"tests: not valid JSON ({exc.msg})") from None
        else:
            return TestSpec("script", script=obj)
    if not isinstance(obj, dict):
        raise TestSpecError(f"tests: expected an object, got {type(obj).__name__}")
    if "test" in obj:
        script = str(obj["test"])
        entry = obj.get("entry_point") or None
        if entry:
            if not isinstance(entry, str) or not entry.isidentifier():
                raise TestSpecError(f"tests: entry_point {entry!r} is not a Python identifier")
            script += f"\n\ncheck({entry})\n"
        return TestSpec("script", fn_name=entry, script=script)
    if "test_list" in obj:
        asserts = obj["test_list"]
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise TestSpecError("tests: 'test_list' must be a list of strings")
        if not asserts:
            raise TestSpecError("tests: no test cases")
        setup = str(obj.get("test_setup_code") or "")
        return TestSpec("asserts", list(asserts), [None] * len(asserts), script=setup)
    if "inputs" not in obj or "outputs" not in obj:
        raise TestSpecError("tests: need 'inputs' and 'outputs' (APPS) or 'test' (HumanEval)")
    inputs, outputs = obj["inputs"], obj["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise TestSpecError("tests: 'inputs' and 'outputs' must be lists")
    if len(inputs) != len(outputs):
        raise TestSpecError(
            f"tests: {len(inputs)} inputs but {len(outputs)} outputs; they pair up one to one"
        )
    if not inputs:
        raise TestSpecError("tests: no test cases")
    name = obj.get("fn_name") or fn_name
    if name:
        if not isinstance(name, str) or not name.isidentifier():
            raise TestSpecError(f"tests: fn_name {name!r} is not a Python identifier")
        return TestSpec("call", list(inputs), list(outputs), name)
    return TestSpec("stdio", [_as_text(x) for x in inputs], [_as_text(x) for x in outputs])


def _as_text(x: Any) -> str:
    return "\n".join(map(str, x)) if isinstance(x, list) else str(x)


def extract_program(response: str) -> str:
    """The last fenced code block (```python preferred), else the whole response."""
    blocks = re.findall(r"```(\w*)[^\n]*\n(.*?)```", response, re.S)
    if not blocks:
        return response
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [code for _, code in blocks])[-1]
