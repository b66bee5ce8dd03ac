"""A run that trains on a reward of 0 says so: when every sample of the first
:data:`WATCHED_STEPS` steps scored 0, rank 0 warns once, naming the commonest reason the
workloads recorded (a code reward's first failing test, a reward that raised). A reward
that is broken for every sample (tests it cannot run, a wrong field mapping) would
otherwise train silently on nothing. Pure logic: the metrics line and the log carry it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

WATCHED_STEPS = 5
# Where the workloads put why a sample scored what it did (runtime/workloads/agents).
REASON_KEYS = ("reward_error", "test_error")


@dataclass
class ZeroRewardWatch:
    steps: int = 0  # steps seen, all of whose samples scored 0
    samples: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    done: bool = False  # warned, or a sample scored above 0: nothing more to watch

    def observe(self, samples: list[Any]) -> str | None:
        """The warning, once, at the step that completes the watch; None otherwise."""
        if self.done or not samples:
            return None
        if any(s.reward != 0 for s in samples):
            self.done = True
            return None
        self.steps += 1
        self.samples += len(samples)
        for s in samples:
            reason = next((str(s.info[k]) for k in REASON_KEYS if s.info.get(k)), None)
            self.reasons[_kind(reason) if reason else "no reason recorded"] += 1
        if self.steps < WATCHED_STEPS:
            return None
        self.done = True
        reason, count = self.reasons.most_common(1)[0]
        return (
            f"reward 0 for every sample of the first {self.steps} steps ({self.samples} "
            f"samples); commonest reason ({count} of them): {reason}"
        )


def _kind(reason: str) -> str:
    # "test 3: error: NameError: ..." and "test 0: error: NameError: ..." are one kind.
    head, sep, rest = reason.partition(": ")
    if sep and head.startswith("test ") and head[5:].isdigit():
        return rest[:200]
    return reason[:200]
