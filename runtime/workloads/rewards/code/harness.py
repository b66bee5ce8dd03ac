"""The harness: /code/main.py of every call, record and replay run, and how its one
verdict line is read back.

Everything else (the program, the tests, the recorded calls) comes on stdin as JSON, so
no file in the sandbox holds the program or its tests."""

from __future__ import annotations

import inspect
import json
from typing import Any

from runtime.workloads.rewards.code import plain
from runtime.workloads.rewards.code.formats import PYTEST_SHIM
from runtime.workloads.rewards.code.plain import _DEPTH, _NODES, _decode, _encode, _NotPlain
from runtime.workloads.rewards.code.prelude import PRELUDE
from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits

# The harness's verdict line starts with this; a run has a verdict when it printed exactly one.
_MARK = "@@reflow-verdict@@"

_HARNESS_MAIN = r'''
import builtins, json, linecache, os, random, sys, traceback

_write, _exit, _dumps, _loads = os.write, os._exit, json.dumps, json.loads
_MISSING = object()


class _Refused(BaseException):
    """Raised into the tests where the program's answer cannot be used; a BaseException so
    that a test's ``except Exception`` does not swallow it (a flag also records it)."""


def _exc_name(e):
    for c in type(e).__mro__:
        if getattr(builtins, c.__name__, None) is c:
            return c.__name__
    return "BaseException"


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


def _has_nan(v):
    todo = [v]
    while todo:
        v = todo.pop()
        if type(v) is float and v != v:
            return True
        if type(v) is not list or len(v) != 2 or type(v[0]) is not str:
            continue
        tag, body = v
        if tag == "f":
            if body == "nan":
                return True
        elif tag in ("l", "t", "s", "fs", "LN"):
            todo += body
        elif tag in ("d", "C", "O"):
            todo += [x for pair in body for x in pair]
        elif tag == "D":
            todo += [x for pair in body[1] for x in pair]
        elif tag == "Q":
            todo += body[0]
        elif tag == "TN":
            todo += [row[0] for row in body]
    return False


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


def _load(program, preamble=""):
    ns = _fresh()
    if preamble:
        exec(_compile(preamble, "<preamble>"), ns)
    exec(_compile(program, "main.py"), ns)
    return ns


def _classes(ns):
    # The ListNode/TreeNode classes values are rebuilt as in this namespace, where it has them.
    return {k: ns[k] for k in ("ListNode", "TreeNode") if isinstance(ns.get(k), type)}


def _solution_method(ns, name):
    # APPS's fn_name and a plain entry point may name a method of LeetCode's class Solution.
    cls = ns.get("Solution")
    if isinstance(cls, type) and callable(getattr(cls, name, None)):
        return getattr(cls(), name)
    return _MISSING


def _call(job):
    try:
        ns = _load(job["program"], job.get("preamble", ""))
        name = job["fn"]
        fn = _solution_method(ns, name)
        if fn is _MISSING:
            fn = ns[name]
        out = fn(*job["args"])
    except BaseException as e:
        return {"status": "error", "error": _tb(e)}
    try:
        return {"value": _encode(out)}
    except _NotPlain as e:
        return {"status": "non_plain", "error": f"returned a {e} where a plain value was expected"}


def _record(job):
    try:
        ns = _load(job["program"], job.get("preamble", ""))
    except BaseException as e:
        return {"status": "error", "error": _tb(e)}
    own, prelude, entry = set(job.get("own", ())), _fresh(), job.get("entry")
    objects, keep = {}, []
    calls = []  # the unit under way's (rebound per unit; the closures read it late)
    program_classes = _classes(ns)
    tests = {}  # the namespace of the unit under way

    class _Obj:
        """An object of the program's own class as the tests see it here: its methods
        are calls into the program (recorded like any other), an attribute set on it is
        set on the object, one read from it is recorded as a plain value."""

        __slots__ = ("_h",)

        def __getattr__(self, attr):
            return member(object.__getattribute__(self, "_h"), attr)

        def __setattr__(self, attr, value):
            setattr(keep[object.__getattribute__(self, "_h")], attr, value)

    def handle_of(x):
        if type(x) is _Obj:
            return object.__getattribute__(x, "_h")
        return objects.get(id(x))

    def real(n):  # a handle, as the program's code receives it
        return keep[n]

    def wrapped(n):  # a handle, as the tests receive it
        o = _Obj.__new__(_Obj)
        object.__setattr__(o, "_h", n)
        return o

    found = {}

    def lookup(name):
        if name not in found:
            found[name] = target_of(name)
        return found[name]

    def target_of(name):
        target = ns.get(name, _MISSING)
        if target is not _MISSING and name not in own and target is prelude.get(name, None):
            target = _MISSING  # the prelude's, not the program's: an empty program has it too
        if target is _MISSING and name == entry:
            target = _solution_method(ns, name)
        if target is _MISSING:
            raise NameError(f"name {name!r} is not defined by the program")
        return target

    def member(h, attr):
        value = getattr(keep[h], attr)
        name = f"{h}.{attr}"
        if callable(value):
            return recorder(name, lambda: value)
        rec = {"n": name, "a": "get"}
        calls.append(rec)
        return result(rec, value)

    def result(rec, out):
        try:
            rec["r"] = _encode(out, handle_of)
            if _has_nan(rec["r"]):
                # NaN fails every comparison, so a negated check (``assert not
                # abs(got - want) > 1e-6``) passes on it: no answer is NaN here.
                raise _NotPlain("NaN")
        except _NotPlain as e:
            rec.pop("r", None)
            rec["np"] = str(e)
            raise _Refused("non-plain result")
        return _decode(rec["r"], wrapped, _classes(tests))

    def recorder(name, find_target):
        def call(*args, **kwargs):
            key = _key(args, kwargs, handle_of)
            try:
                target = find_target()
            except NameError:
                calls.append({"n": name, "a": key, "x": "NameError"})
                raise
            copies = [a if _opaque(k) else _decode(k, real, program_classes)
                      for a, k in zip(args, key[0])]
            given = dict(key[1])
            kw = {n: v if _opaque(given[n]) else _decode(given[n], real, program_classes)
                  for n, v in kwargs.items()}
            rec = {"n": name, "a": key}
            calls.append(rec)
            state = random.getstate()  # the tests' random numbers stay the tests' own
            try:
                out = target(*copies, **kw)
            except BaseException as e:
                rec["x"] = _exc_name(e)
                raise
            finally:
                random.setstate(state)
            if isinstance(target, type):
                objects[id(out)] = rec["h"] = len(keep)
                keep.append(out)
                return wrapped(rec["h"])
            value = result(rec, out)
            changed = {}
            try:
                for i, (a, c, k) in enumerate(zip(args, copies, key[0])):
                    if c is not a and _encode(c, handle_of) != k:
                        changed[str(i)] = _encode(c, handle_of)
                        _apply(a, _decode(changed[str(i)], wrapped, _classes(tests)))
            except _NotPlain as e:
                rec["np"] = str(e)
                raise _Refused("non-plain argument")
            if changed:
                rec["u"] = changed
            return value

        return call

    # One program for all the units, in order, as the dataset's own harness runs its
    # asserts: state the program keeps between calls (a global counter, a mutable
    # default) is seen by the later ones. Each unit's tests start afresh.
    results = []
    for unit in job["units"]:
        calls = []
        tests.clear()
        tests.update(_fresh())
        for name in unit["names"]:
            tests[name] = recorder(name, lambda name=name: lookup(name))
        random.seed(0)
        try:
            exec(_compile(unit["probe"], "<test>"), tests)
        except BaseException:
            pass  # the replay meets the same end and judges it
        results.append({"calls": calls})
    return {"results": results}


def _replay_one(code, calls, names):
    used = [False] * len(calls)
    handles, flags, made = {}, [], [0]
    ns = _fresh()

    class _Handle:
        """An object of the program's own class, in the replay: it may be passed back to
        the program and given attributes, and its methods answer from the record; it is
        never compared or tested."""

        def _refuse(self, *a, **k):
            flags.append("non_plain")
            raise _Refused("an object of the program's own class was compared")

        __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _refuse
        __len__ = __iter__ = __contains__ = __hash__ = __int__ = __float__ = __index__ = _refuse

        def __getattr__(self, attr):
            name = f"{object.__getattribute__(self, '_n')}.{attr}"
            i = next((i for i, r in enumerate(calls) if not used[i] and r.get("n") == name),
                     None)
            if i is None:
                flags.append("error")
                raise _Refused(f"the program's object was not asked for {attr!r} here")
            if calls[i].get("a") != "get":
                return proxy(name)
            used[i] = True
            made[0] += 1
            return answer(name, calls[i], ())

    def handle_of(x):
        return object.__getattribute__(x, "_n") if type(x) is _Handle else None

    def resolve(n):
        if n not in handles:
            h = _Handle()
            object.__setattr__(h, "_n", n)
            handles[n] = h
        return handles[n]

    def find(name, key):
        loose = '["?", null]' in _dumps(key)
        for exact in (True, False):
            for i, rec in enumerate(calls):
                if used[i] or rec.get("n") != name:
                    continue
                a = rec.get("a")
                if a == key if exact else loose and '["?", null]' in _dumps(a):
                    return i
        return None

    def answer(name, rec, args):
        if "x" in rec:
            cls = getattr(builtins, rec["x"], None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                flags.append("error")
                raise _Refused(f"{name}() ended the program ({rec['x']})")
            if issubclass(cls, (StopIteration, StopAsyncIteration)):
                # Raised into map(), filter() or iter(f, x), it would end the test's
                # loop there, as if every case had been checked.
                flags.append("error")
                raise _Refused(f"{name}() raised {rec['x']}, which ends an iteration")
            if cls is NameError:
                raise NameError(f"{name} is not defined by the program")
            raise cls(f"raised by the program in {name}()")
        if "np" in rec:
            flags.append("non_plain")
            raise _Refused(
                f"{name}() returned a {rec['np']} where a plain value was expected"
            )
        if "h" in rec:
            return resolve(rec["h"])
        for i_arg, after in rec.get("u", {}).items():
            _apply(args[int(i_arg)], _decode(after, resolve, _classes(ns)))
        return _decode(rec["r"], resolve, _classes(ns))

    def proxy(name):
        def call(*args, **kwargs):
            i = find(name, _key(args, kwargs, handle_of))
            if i is None:
                flags.append("error")
                raise _Refused(f"{name}(...) here was not run by the program")
            used[i] = True
            made[0] += 1
            return answer(name, calls[i], args)
        return call

    for name in names:
        ns[name] = proxy(name)
    random.seed(0)
    try:
        exec(_compile(code, "<test>"), ns)
    except AssertionError as e:
        return {"ok": False, "status": flags[0] if flags else "wrong_answer", "error": _tb(e)}
    except BaseException as e:
        return {"ok": False, "status": flags[0] if flags else "error", "error": _tb(e)}
    if flags:
        return {"ok": False, "status": flags[0], "error": "the test caught the grader's refusal"}
    if not made[0]:
        # A test that never reached the program measured nothing of it (an empty program
        # whose function the tests found elsewhere, say).
        return {"ok": False, "status": "no_program_call",
                "error": "the test called nothing of the program"}
    return {"ok": True}


def _replay(job):
    return {"results": [_replay_one(u["code"], u["calls"], u["names"]) for u in job["units"]]}


def _main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    job = _loads(sys.stdin.read())
    try:
        import pytest
    except ImportError:  # the tests of pytest-style sets import it; the sandbox has none
        shim = type(sys)("pytest")
        exec(PYTEST_SHIM, shim.__dict__)
        sys.modules["pytest"] = shim
    out = os.dup(1)
    os.dup2(2, 1)  # what the program and the tests print goes to stderr, apart from this
    result = {"call": _call, "record": _record, "replay": _replay}[job["mode"]](job)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    data = ("\n" + MARK + _dumps(result) + "\n").encode()
    while data:
        data = data[_write(out, data):]
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
        inspect.getsource(_NotPlain),
        inspect.getsource(_encode),
        inspect.getsource(plain._encode_nodes),
        inspect.getsource(_decode),
        inspect.getsource(plain._decode_nodes),
        inspect.getsource(plain._DefaultListNode),
        inspect.getsource(plain._DefaultTreeNode),
        "_DEFAULT_NODE_CLASSES = {'ListNode': _DefaultListNode, 'TreeNode': _DefaultTreeNode}\n",
        _HARNESS_MAIN,
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
    return sandbox.run_python(_HARNESS, json.dumps(job), limits)
