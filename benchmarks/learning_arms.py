"""One learning arm (a recipe in one mode, one seed, one set of overrides) run to a record.

An arm runs the way ``reflow launch --local --wait`` runs it, in a runs folder of its own,
while a sampler thread watches the machine; its run folder is then reduced to a small JSON
record (``docs/learning/<arm>.json``) that holds everything the learning report uses, so
that the report is rebuilt from committed records alone, on any clone, and a later session
(maybe on a new machine) goes on with the arms still missing:

- per step: the reward of the generated samples (``rollout_reward_mean``: every group
  delivered since the previous step, before a sampler drops any), the batch's own reward,
  the batch's fresh and replayed sample counts and fresh and trained tokens, its oldest
  sample's age and the wall seconds since the first step;
- every held-out eval: its step, its wall seconds, the seconds spent in evals up to it
  (``eval_s`` in metrics.jsonl: evals stall the trainer leader, so the report's clock
  takes them out), and the reward;
- the run's end state and ledger, the commit it ran, the settings, and the load.

**Busy machines.** The figure that decides is the *foreign* CPU: the CPU seconds, per
second of the run, of the processes on the machine that are not the run's (not the
launcher or a descendant of it, nor a process carrying the arm's environment marker),
from their ``/proc`` counters at each sample. An arm whose foreign CPU is above
``BUSY_FOREIGN_CORES`` (a tenth of this 2-core machine) is marked busy and left out of
every wall-clock figure; its per-step figures still count. Records made before
2026-12-05 11:30 UTC have only the older figure, runnable threads not the run's, judged
against ``BUSY_FOREIGN``: it over-counts, since on a machine the run itself oversubscribes
(9 runnable threads of its own on 2 cores) a process that wakes for a moment waits in the
run queue and is seen runnable: the tool backend, seen runnable in 90 of 155 samples of
an arm, had used 0.16 s of CPU in 15 minutes.
The 1/5/15-minute load averages before and during the run are recorded too, for the
reader: they include the run's own ranks, and before an arm the previous arm's tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from runtime.config.modes import policy

RECORD_FORMAT = 1
BUSY_FOREIGN_CORES = 0.2  # CPU seconds per second not the run's, above which it is busy
BUSY_FOREIGN = 0.5  # the older records' rule: mean runnable threads not the run's
SAMPLE_EVERY_S = 5.0
ARM_ENV = "REFLOW_LEARNING_ARM"  # set in the arm's environment: marks its processes

# metrics.jsonl -> the record's per-step columns (a missing key is None for that step)
STEP_COLUMNS = {
    "rollout_reward": "rollout_reward_mean",
    "batch_reward": "reward_mean",
    "fresh": "batch_unused",
    "replayed": "batch_replay",
    "fresh_tokens": "fresh_tokens",
    "tokens": "tokens",
    "max_age": "max_sample_age",
}


class BadRecord(ValueError):
    """A record or run folder the report cannot use; the message names the file."""


@dataclass(frozen=True)
class ArmSpec:
    """What identifies an arm: two runs of the same spec are the same arm."""

    recipe: str  # path relative to the repo, e.g. recipes/demo.yaml
    mode: str
    seed: int
    steps: int
    eval_every: int
    sets: tuple[str, ...] = ()  # overrides beyond the mode's own (sorted "key=value")

    @property
    def variant(self) -> str:
        """The overrides in a name ("default" without any)."""
        return ",".join(self.sets) or "default"

    @property
    def name(self) -> str:
        """The record's file stem: recipe, mode, variant, seed (filesystem-safe)."""
        stem = Path(self.recipe).parent.name if Path(self.recipe).name == "recipe.yaml" else ""
        stem = stem or Path(self.recipe).stem
        parts = [stem, self.mode]
        if self.sets:  # "reflow.delta=0" -> "delta0": the field's name and its value
            short = [k.rpartition(".")[2] + v for k, _, v in (s.partition("=") for s in self.sets)]
            parts.append(re.sub(r"[^A-Za-z0-9_.+]+", "_", "+".join(short)))
        return "-".join([*parts, f"s{self.seed}"])

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "mode": self.mode,
            "seed": self.seed,
            "steps": self.steps,
            "eval_every": self.eval_every,
            "sets": list(self.sets),
        }

    @classmethod
    def from_json(cls, d: dict, where: str) -> ArmSpec:
        try:
            return cls(
                str(d["recipe"]),
                str(d["mode"]),
                int(d["seed"]),
                int(d["steps"]),
                int(d["eval_every"]),
                tuple(str(s) for s in d["sets"]),
            )
        except (KeyError, TypeError, ValueError):
            msg = f"{where}: 'arm' needs recipe, mode, seed, steps, eval_every, sets"
            raise BadRecord(msg) from None


# ---- the machine while an arm runs ------------------------------------------------------


def _proc_stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, state) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[1]), rest[0]


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: str) -> tuple[int, int] | None:
    """(start time, user + system CPU ticks) of a process, None when it is gone: the start
    time tells a process from a later one under the same pid."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(rest[19]), int(rest[11]) + int(rest[12])


@dataclass
class CpuSplit:
    """CPU seconds of the run and of everything else between successive :meth:`sample`
    calls. A process first seen at a sample counts its whole CPU time when it started after
    the previous sample, else none (the first sample is the baseline); one that starts and
    ends between two samples is not seen (a command of a moment)."""

    me: int
    own_s: float = 0.0
    foreign_s: float = 0.0
    foreign_seen: Counter[str] = field(default_factory=Counter)  # command -> ticks
    _last: dict[int, tuple[int, int]] = field(default_factory=dict)
    _last_uptime_ticks: int | None = None

    def sample(self, root_pid: int | None, marker: bytes) -> None:
        procs = _processes()
        ours = run_processes(root_pid, marker, procs)
        uptime_ticks = int(float(Path("/proc/uptime").read_text().split()[0]) * TICKS_PER_S)
        now: dict[int, tuple[int, int]] = {}
        for p, ppid in procs.items():
            if p == self.me or p == 2 or ppid == 2:  # the sampler, kernel threads
                continue
            ticks = _cpu_ticks(str(p))
            if ticks is None:
                continue
            now[p] = ticks
            start, used = ticks
            if self._last_uptime_ticks is None:
                continue  # the baseline
            before = self._last.get(p)
            if before is not None and before[0] == start:
                delta = used - before[1]
            elif start >= self._last_uptime_ticks:
                delta = used  # started since the previous sample
            else:
                delta = 0  # seen for the first time, running before: no baseline
            if p in ours:
                self.own_s += delta / TICKS_PER_S
            elif delta:
                self.foreign_s += delta / TICKS_PER_S
                self.foreign_seen[_command(str(p))] += delta
        self._last, self._last_uptime_ticks = now, uptime_ticks


def _marked(pid: str, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _runnable_threads(pid: str) -> int:
    n = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        n += state == "R"
    return n


def _processes() -> dict[int, int]:
    """Every process's parent pid, right now."""
    return {int(p): s[0] for p in os.listdir("/proc") if p.isdigit() and (s := _proc_stat(p))}


def run_processes(
    root_pid: int | None, marker: bytes, procs: dict[int, int] | None = None
) -> set[int]:
    """The run's processes: ``root_pid``'s tree and every process carrying ``marker`` in
    its environment (submitit's local ranks outlive a killed launcher, so the tree alone
    is not enough)."""
    procs = _processes() if procs is None else procs
    children: dict[int, list[int]] = {}
    for p, ppid in procs.items():
        children.setdefault(ppid, []).append(p)
    ours: set[int] = set()
    todo = [root_pid] if root_pid else []
    while todo:
        p = todo.pop()
        if p not in ours:
            ours.add(p)
            todo.extend(children.get(p, []))
    return ours | {p for p in procs if p != os.getpid() and _marked(str(p), marker)}


def runnable_split(
    root_pid: int | None, marker: bytes, me: int, seen: Counter[str] | None = None
) -> tuple[int, int]:
    """(runnable threads of the run, runnable threads of everything else) right now (the
    run as :func:`run_processes` finds it); this process (the sampler) and kernel threads
    count as neither. ``seen`` counts the foreign processes found runnable, by command
    line: what made an arm busy is then in its record."""
    procs = _processes()
    ours = run_processes(root_pid, marker, procs)
    own = foreign = 0
    for p, ppid in procs.items():
        # kernel threads (kthreadd, pid 2, and its children) are left out: the run's own
        # loopback traffic keeps ksoftirqd and kworkers runnable, which is not another load
        if p == me or p == 2 or ppid == 2:
            continue
        n = _runnable_threads(str(p))
        if n and p in ours:
            own += n
        elif n:
            foreign += n
            if seen is not None:
                seen[_command(str(p))] += n
    return own, foreign


def _command(pid: str) -> str:
    """A process's command line, shortened (its name if the line cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return shorten_command(raw)


def shorten_command(raw: bytes, width: int = 80) -> str:
    """A `/proc/PID/cmdline` as one line of `width` characters, the program by its file name:
    a checkout's path (`/check/work/main/.venv/bin/python3`) would otherwise eat the width
    and cut off the arguments that tell one process from another."""
    program, _, args = raw.strip(b"\0").partition(b"\0")
    line = b" ".join([program.rsplit(b"/", 1)[-1], args.replace(b"\0", b" ")])
    return line.decode(errors="replace").strip()[:width] or "?"


def kill_tree(root_pid: int, marker: bytes, settle_s: float = 10.0) -> None:
    """SIGKILL every process of the run (an arm past its time limit, or a plan stopped),
    in rounds until a round finds none alive: a single pass missed the ranks and vLLM
    engines a launcher started while the pass went on, and they ran beside the next two
    arms (2026-12-05)."""
    deadline = time.monotonic() + settle_s
    while True:
        alive = [p for p in run_processes(root_pid, marker) if _alive(str(p))]
        if not alive or time.monotonic() > deadline:
            return
        for p in alive:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.2)


def _alive(pid: str) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[1] != "Z"  # a zombie is dead, waiting for its reaper


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@dataclass
class LoadWatch:
    """Samples the machine every ``every`` seconds in a thread until stopped."""

    marker: bytes
    every: float = SAMPLE_EVERY_S
    root_pid: int | None = None
    own: list[int] = field(default_factory=list)
    foreign: list[int] = field(default_factory=list)
    foreign_seen: Counter[str] = field(default_factory=Counter)
    load_1m: list[float] = field(default_factory=list)
    cpu: CpuSplit = field(default_factory=lambda: CpuSplit(os.getpid()))
    _started: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._started = time.monotonic()
        self.cpu.sample(self.root_pid, self.marker)  # the baseline
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.cpu.sample(self.root_pid, self.marker)
            own, foreign = runnable_split(
                self.root_pid, self.marker, os.getpid(), self.foreign_seen
            )
            self.own.append(own)
            self.foreign.append(foreign)
            self.load_1m.append(load_average()[0])

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.cpu.sample(self.root_pid, self.marker)
        wall = max(time.monotonic() - self._started, 1e-9)
        return {
            "samples": len(self.foreign),
            "every_s": self.every,
            # CPU seconds per second of the run (cores): what decides busy
            "foreign_cpu_cores": round(self.cpu.foreign_s / wall, 4),
            "own_cpu_cores": round(self.cpu.own_s / wall, 3),
            "foreign_cpu_seen_s": {
                cmd: round(ticks / TICKS_PER_S, 2)
                for cmd, ticks in self.cpu.foreign_seen.most_common(8)
            },
            "foreign_runnable_mean": _mean(self.foreign),
            "foreign_runnable_max": max(self.foreign, default=None),
            "own_runnable_mean": _mean(self.own),
            "load_1m_mean": _mean(self.load_1m),
            "load_1m_max": max(self.load_1m, default=None),
            # the foreign processes found runnable most often (runnable threads summed
            # over the samples): what made the arm busy, if it was
            "foreign_seen": dict(self.foreign_seen.most_common(8)),
        }


def _mean(xs: list) -> float | None:
    return round(statistics.fmean(xs), 3) if xs else None


def machine_before() -> dict:
    own, foreign = runnable_split(None, b"\0never\0", os.getpid())
    return {"load_avg": load_average(), "runnable_now": own + foreign, "cores": os.cpu_count()}


def busy_reason(machine: dict) -> str | None:
    """Why an arm's wall clock does not count, or None."""
    during = machine.get("during") or {}
    cores = during.get("foreign_cpu_cores")
    if cores is not None:
        if cores > BUSY_FOREIGN_CORES:
            return f"foreign CPU {cores:.2f} cores on average (> {BUSY_FOREIGN_CORES})"
        return None
    foreign = during.get("foreign_runnable_mean")  # a record from before the CPU figure
    if foreign is None:
        return "no load samples during the run"
    if foreign > BUSY_FOREIGN:
        return f"foreign load {foreign:.2f} runnable threads on average (> {BUSY_FOREIGN})"
    return None


# ---- run folder -> record ---------------------------------------------------------------


def _metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """The step lines and the eval lines (an eval on the rollout engines, written when it
    ended under the step that published its version: ``eval_version``) of metrics.jsonl."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadRecord(f"{path}: cannot read ({exc.strerror})") from None
    steps, evals = [], []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            x = json.loads(raw)
            if "eval_version" in x:
                int(x["step"])
                evals.append(x)
                continue
            float(x["wall_s"]), int(x["step"])
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            raise BadRecord(f"{path}:{i}: not a metrics line with step and wall_s") from None
        steps.append(x)
    return steps, evals


def held_out_figures(line: dict, when: str) -> dict[str, float]:
    """A metrics line's held-out figures under one name whenever they were taken: the
    arith kind's ``eval_reward`` (``eval_reward_start`` / ``_end``) and each set's
    ``eval/<set>/<figure>`` (``eval_start/...`` on step 1's line for the eval before it);
    ``when`` is ``start`` (the policy before training) or ``after`` (this line's step)."""
    out = {}
    for key, value in line.items():
        if when == "start" and key == "eval_reward_start":
            out["eval_reward"] = float(value)
        elif when == "start" and key.startswith("eval_start/"):
            out["eval/" + key.removeprefix("eval_start/")] = float(value)
        elif when == "after" and key in ("eval_reward", "eval_reward_end"):
            out["eval_reward"] = float(value)
        elif when == "after" and key.startswith("eval/"):
            out[key] = float(value)
    return out


def record_from_run(
    folder: Path, spec: ArmSpec, *, commit: str, machine: dict, held_out: str = "eval_reward"
) -> dict:
    """The record of one finished (or failed) arm from its run folder; ``held_out`` names
    the figure the report reads as the held-out reward (each eval's ``reward``)."""
    rec: dict = {
        "format": RECORD_FORMAT,
        "arm": spec.to_json(),
        "name": spec.name,
        "commit": commit,
        "run_folder": folder.name,
        "held_out": held_out,
        "machine": machine,
        "problem": None,
        "steps": {},
        "evals": [],
        "summary": None,
    }
    summary_path = folder / "summary.json"
    if summary_path.exists():
        try:
            s = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            raise BadRecord(f"{summary_path}: not JSON") from None
        keep = (
            "state", "reason", "wall_s", "steps", "samples", "wasted_tokens", "ledger_violations",
            "held_across_sync", "trainer_idle_ratio", "rollout_idle_ratio",
            "trainer_idle_by_cause", "rollout_idle_by_cause", "trainer_tokens_per_s",
        )  # fmt: skip
        rec["summary"] = {k: s.get(k) for k in keep if k in s}
    metrics = folder / "metrics.jsonl"
    lines, eval_lines = _metrics(metrics) if metrics.exists() else ([], [])
    if not lines:
        rec["problem"] = "no training step in metrics.jsonl"
        return rec
    t0 = lines[0]["wall_s"]
    rec["steps"] = {
        "step": [x["step"] for x in lines],
        "wall_s": [round(x["wall_s"] - t0, 3) for x in lines],
        **{col: [x.get(key) for x in lines] for col, key in STEP_COLUMNS.items()},
    }
    eval_s = 0.0
    blocking_at: dict[int, float] = {}  # the leader's eval seconds up to each step
    for x in lines:
        eval_s += float(x.get("eval_s", 0.0))
        blocking_at[x["step"]] = round(eval_s, 3)
        start = held_out_figures(x, "start")
        if start:
            rec["evals"].append({"step": 0, "wall_s": 0.0, "eval_s": 0.0, "figures": start})
        after = held_out_figures(x, "after")
        if after:
            rec["evals"].append(
                {
                    "step": x["step"],
                    "wall_s": round(x["wall_s"] - t0, 3),
                    "eval_s": round(eval_s, 3),  # evals' seconds up to this one, its own in
                    "figures": after,
                }
            )
    # Evals on the rollout engines stall no training: no eval seconds of their own on the
    # training clock; their figures join those of the same step (the arith kind's own
    # eval_reward stays the trainer's, on the step's line).
    wall_at = {x["step"]: round(x["wall_s"] - t0, 3) for x in lines}
    for x in eval_lines:
        start = held_out_figures(x, "start")
        figures = start or held_out_figures(x, "after")
        if not figures:
            continue
        step = 0 if start else int(x["step"])
        same = next((e for e in rec["evals"] if e["step"] == step), None)
        if same is not None:
            same["figures"].update(figures)
            continue
        rec["evals"].append(
            {
                "step": step,
                "wall_s": wall_at.get(step, 0.0),
                "eval_s": blocking_at.get(step, 0.0),
                "figures": figures,
            }
        )
    rec["evals"].sort(key=lambda e: e["step"])
    for e in rec["evals"]:  # the figure the report reads; the others stay for the reader
        e["reward"] = e["figures"].get(held_out)
    rec["problem"] = run_problem(rec, lines, spec)
    return rec


def run_problem(rec: dict, lines: list[dict], spec: ArmSpec) -> str | None:
    s = rec["summary"]
    if s is None:
        return "no summary.json (still running, or killed)"
    if s.get("state") != "COMPLETED":
        return f"state {s.get('state')} ({s.get('reason')})"
    if any(x.get("attempt", 1) != 1 for x in lines):
        return "resumed: wall_s restarts at each attempt"
    if lines[-1]["step"] != spec.steps:
        return f"ended at step {lines[-1]['step']} of {spec.steps}"
    if not rec["evals"] or rec["evals"][-1]["step"] != spec.steps:
        return "no held-out eval at the last step"
    if any(e["reward"] is None for e in rec["evals"]):
        return f"an eval without {rec['held_out']}"
    return None


def write_record(rec: dict, records: Path) -> Path:
    records.mkdir(parents=True, exist_ok=True)
    path = records / f"{rec['name']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, separators=(",", ":")) + "\n")
    tmp.replace(path)
    return path


def read_json(path: Path, error: type[ValueError] = ValueError) -> object:
    """A JSON file's content; ``error`` with one line naming the file when it cannot be
    read or is not JSON."""
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError:
        raise error(f"{path}: not JSON") from None


def read_record(path: Path) -> dict:
    """A committed record, checked for what the report reads."""
    rec = read_json(path, BadRecord)
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise BadRecord(f"{path}: not a learning record of format {RECORD_FORMAT}")
    spec = ArmSpec.from_json(rec.get("arm") or {}, str(path))
    if rec.get("name") != spec.name or path.stem != spec.name:
        raise BadRecord(f"{path}: its name is not its arm's ({spec.name})")
    for e in rec.get("evals", []):
        if not {"step", "wall_s", "eval_s", "reward"} <= set(e):
            raise BadRecord(f"{path}: an eval without step, wall_s, eval_s and reward")
    rec.setdefault("held_out", "eval_reward")  # the records of the first arms name none
    rec["spec"] = spec
    return rec


# ---- running one arm --------------------------------------------------------------------


def git_commit(repo: Path) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "runtime", "jobs")
    return head + ("+dirty" if dirty else "")


def run_arm(
    spec: ArmSpec,
    *,
    repo: Path,
    runs: Path,
    records: Path,
    timeout_s: float,
    held_out: str = "eval_reward",
) -> dict:
    """Run one arm to its end and write its record; returns the record."""
    runs.mkdir(parents=True, exist_ok=True)
    name = f"learn-{spec.name}"
    sets = [
        f"name={name}",
        f"train.steps={spec.steps}",
        f"train.seed={spec.seed}",
        f"train.eval_every={spec.eval_every}",
        *policy(spec.mode).recipe_sets(),
        *spec.sets,
    ]
    cmd = [os.sys.executable, "-m", "reflow_cli.main", "launch", str(repo / spec.recipe), "--local"]
    for s in sets:
        cmd += ["--set", s]
    cmd.append("--wait")
    marker = f"{ARM_ENV}={spec.name}"
    env = {
        **os.environ,
        "REFLOW_RUNS_DIR": str(runs),
        ARM_ENV: spec.name,
        # the arm runs the code of ``repo`` (a snapshot, so that work beside it changes
        # nothing under a running arm), whatever the venv's editable install points at
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    before = set(runs.glob(f"{name}-*"))
    machine = {"before": machine_before()}
    watch = LoadWatch(marker=marker.encode())
    started = time.time()
    with open(runs / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
        watch.root_pid = proc.pid
        watch.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid, marker.encode())
            proc.wait(timeout=60)
            code = None
        except BaseException:  # the plan is stopped (Ctrl-C, SIGTERM): its arm goes too
            kill_tree(proc.pid, marker.encode())
            raise
    machine["during"] = watch.stop()
    machine["seconds"] = round(time.time() - started, 1)
    machine["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    machine["busy"] = busy_reason(machine)
    made = sorted(set(runs.glob(f"{name}-*")) - before)
    made = [d for d in made if d.is_dir()]
    if not made:
        raise BadRecord(f"{spec.name}: no run folder (see {runs / f'{name}.log'})")
    commit = git_commit(repo)
    rec = record_from_run(made[-1], spec, commit=commit, machine=machine, held_out=held_out)
    if code is None:
        rec["problem"] = f"killed after {timeout_s:.0f} s"
    elif code != 0 and rec["problem"] is None:
        rec["problem"] = f"reflow launch exited {code}"
    write_record(rec, records)
    return rec
