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
    _PLAIN_TYPES,
    _decode,
    _encode,
    _NotPlain,
)
from runtime.workloads.rewards.code.prelude import PRELUDE
from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits

# The harness's verdict line starts with this; a run has a verdict when it printed exactly one.
_MARK = "@@reflow-verdict@@"

_HARNESS_MAIN = r'''
import ast, builtins, itertools, json, linecache, os, random, sys, traceback

_write, _exit, _dumps, _loads = os.write, os._exit, json.dumps, json.loads
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
        elif tag in ("l", "t", "s", "fs", "LN", "G"):
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


class _Channel:
    """The harness's own lines: requests and replies on the stdin and stdout it was
    started with, apart from what the program or the tests read and print (their stdin is
    empty, their stdout goes to stderr)."""

    def __init__(self):
        self.inp = os.fdopen(os.dup(0), "rb", buffering=0)
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


def _serve(job, channel):
    """The program's side: load it, then answer each call the tests make, one line in and
    one line out, until the grader closes stdin. It never sees a test, only the arguments
    of the calls into it."""
    try:
        ns = _load(job["program"], job.get("preamble", ""))
    except BaseException as e:
        channel.write({"ready": False, "error": _tb(e)})
        return
    channel.write({"ready": True})
    own, prelude, entry = set(job.get("own", ())), _fresh(), job.get("entry")
    objects, keep, found = {}, [], {}
    classes = _classes(ns)

    def handle_of(x):
        return objects.get(id(x))

    def real(n):
        if type(n) is not int or not 0 <= n < len(keep):
            raise _NotPlain("unknown object")
        return keep[n]

    def target_of(name):
        if "." in name:
            h, attr = name.split(".", 1)
            return getattr(real(int(h)), attr)
        if name not in found:
            target = ns.get(name, _MISSING)
            if target is not _MISSING and name not in own and target is prelude.get(name):
                target = _MISSING  # the prelude's, not the program's: an empty one has it
            if target is _MISSING and name == entry:
                target = _solution_method(ns, name)
            if target is _MISSING:
                raise NameError(name)
            found[name] = target
        return found[name]

    def value(out):
        try:
            if type(out).__name__ == "generator":
                # A test that consumes it (list(candidate(n))) gets its items, drawn here.
                items = list(itertools.islice(out, _GENERATED + 1))
                if len(items) > _GENERATED:
                    return {"np": f"generator of over {_GENERATED} items"}
                enc = ["G", [_encode(x, handle_of) for x in items]]
            else:
                enc = _encode(out, handle_of)
        except _NotPlain as e:
            return {"np": str(e)}
        except BaseException as e:
            return {"x": _exc_name(e), "xa": _exc_args(e)}
        if _has_nan(enc):
            # NaN fails every comparison, so a negated check (``assert not abs(got -
            # want) > 1e-6``) passes on it: no answer is NaN here.
            return {"np": "NaN"}
        return {"r": enc}

    def answer(req):
        name, op = req.get("n"), req.get("op")
        if type(name) is not str:
            return {"np": "malformed request"}
        if op == "set":
            target = None
        else:
            try:
                target = target_of(name)
            except NameError:
                return {"x": "NameError", "xa": ["l", []]}
            except (_NotPlain, AttributeError, ValueError) as e:
                return {"x": "AttributeError", "xa": ["l", [str(e)[:200]]]}
        if op == "get":
            return {"callable": True} if callable(target) else value(target)
        if op == "set":
            # A test setting an attribute of the program's object (MBPP builds trees so:
            # ``root.left = Node(2)``): the object itself is changed.
            h, _, attr = name.partition(".")
            try:
                setattr(real(int(h)), attr, _decode(req.get("v"), real, classes))
            except BaseException as e:
                return {"x": _exc_name(e), "xa": _exc_args(e)}
            return {"r": None}
        key = req.get("a")
        try:
            args = [_decode(k, real, classes) for k in key[0]]
            kwargs = {k: _decode(v, real, classes) for k, v in key[1]}
        except BaseException:
            return {"np": "malformed arguments"}
        try:
            out = target(*args, **kwargs)
        except BaseException as e:
            return {"x": _exc_name(e), "xa": _exc_args(e)}
        if isinstance(target, type):
            objects[id(out)] = len(keep)
            keep.append(out)
            return {"h": len(keep) - 1}
        reply = value(out)
        changed = {}
        try:
            for i, (a, k) in enumerate(zip(args, key[0])):
                after = _encode(a, handle_of)
                if after != k:
                    changed[str(i)] = after
        except _NotPlain as e:
            return {"np": f"argument changed into a {e}"}
        if changed and "r" in reply:
            reply["u"] = changed
        return reply

    while True:
        req = channel.read()
        if req is None:
            return
        channel.write(answer(req))


def _tests(job, channel):
    """The tests' side: each unit of test code as written, with every name that stands
    for the program bound to a stand-in that asks the program's process (through the
    grader) and hands back only plain data. No program code is in this process."""
    for unit in job["units"]:
        channel.write({"unit": _unit(unit["code"], unit["names"], channel)})
    channel.write({"done": True})


def _unit(code, names, channel):
    handles, flags, made = {}, [], [0]
    ns = _fresh()

    def ask(req):
        channel.write({"ask": req})
        reply = channel.read()
        if reply is None:
            flags.append("error")
            raise _Refused("the grader stopped answering")
        if "gone" in reply:
            flags.append(str(reply["gone"]))
            why = reply.get("why") or f"the program's process ended ({reply['gone']})"
            raise _Refused(str(why))
        return reply

    class _Handle:
        """An object of the program's own class: it may be passed back to the program,
        given attributes, and its methods called (through the program's process); it is
        never compared or tested."""

        def _refuse(self, *a, **k):
            flags.append("non_plain")
            raise _Refused("an object of the program's own class was compared")

        __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _refuse
        __len__ = __iter__ = __contains__ = __hash__ = __int__ = __float__ = __index__ = _refuse

        def __setattr__(self, attr, value):
            name = f"{object.__getattribute__(self, '_n')}.{attr}"
            try:
                v = _encode(value, handle_of)
            except _NotPlain:
                flags.append("non_plain")
                raise _Refused(f"{name} was given a value that cannot leave the tests")
            answer(name, ask({"op": "set", "n": name, "v": v}), ())

        def __getattr__(self, attr):
            name = f"{object.__getattribute__(self, '_n')}.{attr}"
            reply = ask({"op": "get", "n": name})
            made[0] += 1
            if reply.get("callable") is True:
                return proxy(name)
            return answer(name, reply, ())

    def handle_of(x):
        return object.__getattribute__(x, "_n") if type(x) is _Handle else None

    def resolve(n):
        if n not in handles:
            h = _Handle()
            object.__setattr__(h, "_n", n)
            handles[n] = h
        return handles[n]

    def answer(name, rec, args):
        if "x" in rec:
            cls = getattr(builtins, str(rec["x"]), None)
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
            try:
                a = _decode(rec.get("xa", ["l", []]))
                exc = cls(*a) if type(a) is list else cls()
            except BaseException:
                exc = cls(f"raised by the program in {name}()")
            raise exc
        if "np" in rec:
            flags.append("non_plain")
            raise _Refused(f"{name}() returned a {rec['np']} where a plain value was expected")
        if "h" in rec:
            return resolve(rec["h"])
        try:
            for i_arg, after in dict(rec.get("u") or {}).items():
                _apply(args[int(i_arg)], _decode(after, resolve, _classes(ns)))
            return _decode(rec["r"], resolve, _classes(ns))
        except (_NotPlain, KeyError, IndexError, TypeError, ValueError, RecursionError):
            flags.append("non_plain")
            raise _Refused(f"{name}() answered with nothing the grader can read")

    class _StandIn:
        """A name of the program's, in the tests: calling it calls the program. It is no
        function of the tests' (``inspect.getsource`` of it fails rather than reading the
        harness: a test that inspects the program's source cannot pass vacuously)."""

        __slots__ = ("__name__",)

        def __init__(self, name):
            self.__name__ = name

        def __call__(self, *args, **kwargs):
            name = self.__name__
            key = _key(args, kwargs, handle_of)
            if any(_opaque(k) for k in key[0]) or any(_opaque(v) for _, v in key[1]):
                flags.append("non_plain")
                raise _Refused(f"{name}() was given a value that cannot leave the tests")
            made[0] += 1
            return answer(name, ask({"op": "call", "n": name, "a": key}), args)

        def __repr__(self):
            return f"<the program's {self.__name__}>"

    def proxy(name):
        return _StandIn(name)

    def literal_only(source, *args, **kwargs):
        # A string the program returned, handed to eval or exec here, would run program
        # code in the tests' process: only literals are evaluated.
        if type(source) is str:
            try:
                return ast.literal_eval(source.strip())
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
        flags.append("error")
        raise _Refused("eval/exec of code is refused in the tests' process (literals only)")

    ns["__builtins__"] = {**vars(builtins), "eval": literal_only, "exec": literal_only}
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
    return sandbox.run_python(_HARNESS, json.dumps(job) + "\n", limits)
