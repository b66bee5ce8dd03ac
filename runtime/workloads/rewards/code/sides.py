"""The two sides of a conversation (:mod:`.relay`), as harness source: ``_serve``, the
program's process, which loads the program and answers each call; ``_tests``, the tests'
process, which runs the test code with the program's names bound to stand-ins that ask
the program's process. :mod:`.harness` pastes this into ``/code/main.py``, where the names
it uses (``_encode``, ``_decode``, ``_Refused``, ...) are defined."""

SIDES_SOURCE = r'''
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
            head, attr = name.rsplit(".", 1)
            base = real(int(head)) if head.isdigit() else target_of(head)
            return getattr(base, attr)
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
            if type(out) is range or (
                hasattr(type(out), "__next__") and hasattr(type(out), "__iter__")
            ):
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
        return {"r": enc}  # a NaN in it is refused by the tests' side, out of reach here

    def answer(req):
        name, op = req.get("n"), req.get("op")
        if type(name) is not str:
            return {"np": "malformed request"}
        if op == "set":
            # A test setting an attribute of the program's object (MBPP builds trees so:
            # ``root.left = Node(2)``): the object itself is changed.
            h, _, attr = name.partition(".")
            try:
                setattr(real(int(h)), attr, _decode(req.get("v"), real, classes))
            except BaseException as e:
                return {"x": _exc_name(e), "xa": _exc_args(e)}
            return {"r": None}
        if op == "eval":
            # A test's eval of a string (HumanEval's ``eval(candidate(n))``) runs here,
            # where program code may run; the tests get the plain value, as from a call.
            source = req.get("s")
            if type(source) is not str or len(source) > 100_000:
                return {"np": "malformed request"}
            try:
                return value(eval(source, ns))
            except BaseException as e:
                return {"x": _exc_name(e), "xa": _exc_args(e)}
        try:
            target = target_of(name)
        except NameError:
            return {"x": "NameError", "xa": ["l", []]}
        except (_NotPlain, AttributeError, ValueError) as e:
            return {"x": "AttributeError", "xa": ["l", [str(e)[:200]]]}
        if op == "get":
            return {"callable": True} if callable(target) else value(target)
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
        same = next((i for i, a in enumerate(args) if out is a), None)
        if same is not None and "r" in reply:
            # The answer is argument ``same`` itself (sorted in place and returned): the
            # tests get their own object back, so ``b is not a`` means what it says.
            reply["same"] = same
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
    sources = job.get("sources") or {}
    for unit in job["units"]:
        channel.write({"unit": _unit(unit["code"], unit["names"], channel, sources)})
    channel.write({"done": True})


def _unit(code, names, channel, sources):
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

        # A comparison would hand the expected value to the program to judge: refused.
        __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
        __int__ = __float__ = __index__ = _refuse

        # These ask the program about its object, as a method call would (len(stack)
        # is stack.__len__()): each answer is a plain value of the program's.
        def __len__(self):
            return self._ask_dunder("__len__")

        def __str__(self):
            return self._ask_dunder("__str__")

        def __iter__(self):
            return iter(self._ask_dunder("__iter__"))

        def __contains__(self, x):
            return self._ask_dunder("__contains__", x)

        def __bool__(self):
            for attr in ("__bool__", "__len__"):  # as Python asks an object
                try:
                    return bool(self._ask_dunder(attr))
                except AttributeError:
                    continue
            return True

        def _ask_dunder(self, attr, *args):
            return _StandIn(f"{object.__getattribute__(self, '_n')}.{attr}")(*args)

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
                return _StandIn(name)
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
            h = resolve(rec["h"])
            object.__setattr__(h, "_cls", name)  # isinstance(h, Stack) asks this
            return h
        if _has_nan(rec.get("r")) or _has_nan(rec.get("u")):
            # NaN fails every comparison, so a negated check (``assert not abs(got -
            # want) > 1e-6``) passes on it: no answer is NaN. Checked here, where the
            # program cannot reach the check.
            flags.append("non_plain")
            raise _Refused(f"{name}() returned NaN where a plain value was expected")
        classes = _classes(ns)
        what = _object_name(rec.get("r"))
        known = classes.get(what) if what is not None else None
        if what is not None and not (known and known.__module__ in _OWN_MODULES):
            # An object of a class the tests do not know (Solution(), self): nothing a
            # test compares with a plain expected value.
            flags.append("non_plain")
            raise _Refused(f"{name}() returned a {what} object where a plain value was expected")
        try:
            for i_arg, after in dict(rec.get("u") or {}).items():
                _apply(args[int(i_arg)], _decode(after, resolve, classes))
            got = _decode(rec["r"], resolve, classes)
            same = rec.get("same")
            if same is None:
                return got
            if type(same) is int and 0 <= same < len(args):
                return args[same]  # the tests' own object, changed as the program did
        except Exception:
            pass
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

        def __getattr__(self, attr):
            # Vec.zero(), Solution.helper: a name of the program's, reached through it.
            if attr.startswith("_"):
                raise AttributeError(attr)
            return _StandIn(f"{self.__name__}.{attr}")

        def __instancecheck__(self, obj):
            return type(obj) is _Handle and obj.__dict__.get("_cls") == self.__name__

    def literal(source):
        if type(source) is str:
            try:
                return True, ast.literal_eval(source.strip())
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
        return False, None

    def relayed_eval(source, *args, **kwargs):
        # A string the program returned, evaluated here, would run program code in the
        # tests' process: a literal is read here, anything else is evaluated in the
        # program's process and comes back as a plain value.
        ok, value = literal(source)
        if ok:
            return value
        if type(source) is str and not args and not kwargs:
            return answer("eval", ask({"op": "eval", "n": "eval", "s": source}), ())
        flags.append("error")
        raise _Refused("eval with namespaces, or of a non-string, is refused in the tests")

    def literal_exec(source, *args, **kwargs):
        ok, _ = literal(source)
        if ok:
            return None
        flags.append("error")
        raise _Refused("exec of code is refused in the tests' process (literals only)")

    def getsource(obj):
        # The program's own text of a function or class of its, for tests that check how
        # it is written ("do not call sorted"); the stand-in holds no code to read.
        if type(obj) is _StandIn:
            text = sources.get(obj.__name__)
            if type(text) is not str:
                raise OSError("could not get source code")
            return text
        return _getsource(obj)

    def getsourcelines(obj):
        if type(obj) is _StandIn:
            return getsource(obj).splitlines(keepends=True), 1
        return _getsourcelines(obj)

    ns["__builtins__"] = {**vars(builtins), "eval": relayed_eval, "exec": literal_exec}
    inspect.getsource, inspect.getsourcelines = getsource, getsourcelines
    for name in names:
        ns[name] = _StandIn(name)
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
'''
