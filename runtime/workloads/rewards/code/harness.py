"""The harness: /code/main.py of every sandboxed process of the grader but a stdio run.
``call`` runs one call of an APPS ``fn_name`` and prints one verdict line; ``serve`` is
the program's side of a conversation (:mod:`.relay`): it loads the program and answers
each call; ``tests`` is the tests' side: it runs the test code with the program's names
bound to stand-ins that ask the program's side.

Everything else (the program, the tests, each call) comes on stdin as JSON lines, so no
file in the sandbox holds the program or its tests; what the harness writes goes to the
stdout it was started with, apart from what the program and the tests print."""

from __future__ import annotations

import inspect
import json
from typing import Any

from runtime.workloads.rewards.code import plain
from runtime.workloads.rewards.code.formats import PYTEST_SHIM
from runtime.workloads.rewards.code.plain import (
    _DEPTH,
    _NODES,
    _OWN_MODULES,
    _PLAIN_TYPES,
    _decode,
    _encode,
    _NotPlain,
)
from runtime.workloads.rewards.code.prelude import PRELUDE
from runtime.workloads.rewards.code.sides import SIDES_SOURCE
from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits

# The harness's verdict line starts with this; a run has a verdict when it printed exactly one.
_MARK = "@@reflow-verdict@@"

_HARNESS_MAIN = r'''
import ast, builtins, inspect, itertools, json, linecache, os, random, sys, traceback

_write, _exit, _dumps, _loads = os.write, os._exit, json.dumps, json.loads
_getsource, _getsourcelines = inspect.getsource, inspect.getsourcelines  # before any unit
_MISSING = object()
_GENERATED = 100_000  # items of a returned generator drawn at most


class _Refused(BaseException):
    """Raised into the tests where the program's answer cannot be used; a BaseException so
    that a test's ``except Exception`` does not swallow it (a flag also notes it)."""


def _exc_name(e):
    for c in type(e).__mro__:
        if getattr(builtins, c.__name__, None) is c:
            return c.__name__
    return "BaseException"


def _exc_args(e):
    # What the program put in its exception, as plain data (a test may compare str(e)).
    try:
        return _encode(list(e.args)[:8])
    except BaseException:
        return ["l", []]


def _tb(e):
    frames = traceback.extract_tb(e.__traceback__)
    frames = [f for f in frames if f.filename in ("main.py", "<test>", "<preamble>")]
    text = "".join(
        ["Traceback (most recent call last):\n", *traceback.format_list(frames),
         *traceback.format_exception_only(type(e), e)]
    )
    return text[-800:]


def _compile(code, filename):
    # Tracebacks then quote the line (feedback shows the failing assert as written).
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    return compile(code, filename, "exec")


def _fresh():
    ns = {"__name__": "__main__", "__builtins__": builtins}
    exec(PRELUDE, ns)
    return ns


def _key(args, kwargs, handle_of):
    def one(a):
        try:
            return _encode(a, handle_of)
        except _NotPlain:
            return ["?", None]
    return [[one(a) for a in args], sorted([k, one(v)] for k, v in kwargs.items())]


def _opaque(k):
    return type(k) is list and k[0] == "?"


def _apply(orig, new):
    # An argument the program changed in place: the test sees the same change.
    t = type(orig)
    if t is list:
        orig[:] = new
    elif t is set or isinstance(orig, dict):
        orig.clear()
        orig.update(new)
    elif t.__name__ == "deque":
        orig.clear()
        orig.extend(new)
    elif t.__name__ in ("ListNode", "TreeNode") and type(new).__name__ == t.__name__:
        # The test's head node keeps its identity and takes the new links (reorderList).
        for attr in ("val", "next", "left", "right"):
            if hasattr(new, attr):
                setattr(orig, attr, getattr(new, attr))


def _load(program, preamble=""):
    ns = _fresh()
    # Graded by its functions, the program is a module, not a script: its ``if __name__ ==
    # "__main__":`` block does not run (it would read stdin, as a script does).
    ns["__name__"] = "solution"
    if preamble:
        exec(_compile(preamble, "<preamble>"), ns)
    exec(_compile(program, "main.py"), ns)
    return ns


def _classes(ns):
    # The classes of this namespace: values of a class of that name are rebuilt as them.
    return {k: v for k, v in list(ns.items()) if isinstance(v, type)}


def _solution_method(ns, name):
    # APPS's fn_name and a plain entry point may name a method of LeetCode's class Solution.
    cls = ns.get("Solution")
    if isinstance(cls, type) and callable(getattr(cls, name, None)):
        return getattr(cls(), name)
    return _MISSING


def _program_function(ns, name, own):
    # The program's ``name``: a method of its class Solution, or what it binds itself. The
    # prelude's ``gcd`` or ``sqrt`` is not the program's: an empty program has them too.
    fn = _solution_method(ns, name)
    if fn is _MISSING:
        fn = ns.get(name, _MISSING)
        if fn is not _MISSING and name not in own and fn is _fresh().get(name):
            fn = _MISSING
    if fn is _MISSING:
        raise NameError(f"{name} is not defined by the program")
    return fn


def _call(job):
    try:
        ns = _load(job["program"], job.get("preamble", ""))
        fn = _program_function(ns, job["fn"], set(job.get("own", ())))
        out = fn(*job["args"])
    except BaseException as e:
        return {"status": "error", "error": _tb(e)}
    try:
        return {"value": _encode(out)}
    except _NotPlain as e:
        return {"status": "non_plain", "error": f"returned a {e} where a plain value was expected"}


class _Channel:
    """The harness's own lines: requests and replies on the stdin and stdout it was
    started with, apart from what the program or the tests read and print (their stdin is
    empty, their stdout goes to stderr)."""

    def __init__(self):
        self.inp = os.fdopen(os.dup(0), "rb")
        self.out = os.dup(1)
        r, w = os.pipe()
        os.close(w)
        os.dup2(r, 0)
        os.dup2(2, 1)
        sys.stdin = open(0, closefd=False)

    def read(self):
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.inp.readline()
            if not chunk:
                break
            line += chunk
        if not line:
            return None
        try:
            msg = _loads(line)
        except ValueError:
            return None
        return msg if type(msg) is dict else None

    def write(self, obj):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        data = ("\n" + MARK + _dumps(obj) + "\n").encode()
        while data:
            data = data[_write(self.out, data):]


SIDES


def _main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    try:
        import pytest
    except ImportError:  # the tests of pytest-style sets import it; the sandbox has none
        shim = type(sys)("pytest")
        exec(PYTEST_SHIM, shim.__dict__)
        sys.modules["pytest"] = shim
    channel = _Channel()
    job = channel.read()
    if job is None:
        _exit(2)
    mode = job.get("mode")
    if mode == "call":
        channel.write(_call(job))
    elif mode == "serve":
        _serve(job, channel)
    elif mode == "tests":
        _tests(job, channel)
    _exit(0)  # no atexit handler or lingering thread of the program's runs after this


_main()
'''


def _harness_source() -> str:
    parts = [
        "from typing import Any\n",
        f"PRELUDE = {PRELUDE!r}\n",
        f"PYTEST_SHIM = {PYTEST_SHIM!r}\n",
        f"MARK = {_MARK!r}\n",
        f"_DEPTH = {_DEPTH!r}\n",
        f"_NODES = {_NODES!r}\n",
        f"_PLAIN_TYPES = ({', '.join(t.__name__ for t in _PLAIN_TYPES)})\n",
        f"_OWN_MODULES = {_OWN_MODULES!r}\n",
        inspect.getsource(_NotPlain),
        inspect.getsource(_encode),
        inspect.getsource(plain._encode_nodes),
        inspect.getsource(_decode),
        inspect.getsource(plain._decode_nodes),
        inspect.getsource(plain._DefaultListNode),
        inspect.getsource(plain._DefaultTreeNode),
        inspect.getsource(plain._has_nan),
        inspect.getsource(plain._object_name),
        "_DEFAULT_NODE_CLASSES = {'ListNode': _DefaultListNode, 'TreeNode': _DefaultTreeNode}\n",
        _HARNESS_MAIN.replace("SIDES\n", SIDES_SOURCE),
    ]
    return "\n\n".join(parts)


_HARNESS = _harness_source()


def _verdict(r: RunResult) -> dict[str, Any] | None:
    """The harness's one record, or None: a run that printed none (an early exit, a crash)
    or more than one (the program printing a record of its own) has no verdict."""
    lines = [line for line in r.stdout.splitlines() if line.startswith(_MARK)]
    if len(lines) != 1:
        return None
    try:
        out = json.loads(lines[0][len(_MARK) :])
    except (ValueError, RecursionError):
        return None
    return out if isinstance(out, dict) else None


def _harness(sandbox: Sandbox, job: dict[str, Any], limits: SandboxLimits) -> RunResult:
    return sandbox.run_python(_HARNESS, json.dumps(job) + "\n", limits)
