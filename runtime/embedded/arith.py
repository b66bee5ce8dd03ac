"""The embedded task: running sums of single digits, worked step by step.

Prompt ``S3+5+2+7=`` asks for the sum; the worked solution writes one partial sum per step
and ends with the answer: ``3+5=8;8+2=10;10+7=17;#17``. The number of steps is drawn from
a long-tailed (geometric) distribution, so response lengths are long-tailed as in
reasoning RL (p99/p50 of response tokens >= 4, checked in the tests). The reward is
rule-verified: 1 when the text after ``#`` is the right sum, else 0.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from runtime.embedded.tiny_qwen3 import BOS, EOS, encode

MAX_STEPS = 14
_ANSWER = re.compile(r"#(-?\d+)")


@dataclass(frozen=True)
class Problem:
    terms: tuple[int, ...]

    @property
    def prompt(self) -> str:
        return "S" + "+".join(map(str, self.terms)) + "="

    @property
    def answer(self) -> int:
        return sum(self.terms)

    def solution(self) -> str:
        parts, acc = [], self.terms[0]
        for t in self.terms[1:]:
            parts.append(f"{acc}+{t}={acc + t}")
            acc += t
        return ";".join(parts) + f";#{acc}"

    def prompt_ids(self) -> list[int]:
        return [BOS, *encode(self.prompt)]

    def solution_ids(self) -> list[int]:
        return [*encode(self.solution()), EOS]


def sample_problem(rng: random.Random, mean_steps: float = 2.2) -> Problem:
    # Geometric number of steps: most problems are short, a few are long.
    p = 1.0 / mean_steps
    steps = 1
    while steps < MAX_STEPS and rng.random() > p:
        steps += 1
    return Problem(tuple(rng.randint(0, 9) for _ in range(steps + 1)))


def reward(response: str, answer: int) -> float:
    m = _ANSWER.search(response)
    return 1.0 if m is not None and int(m.group(1)) == answer else 0.0


def arith_prompts(seed: int) -> Iterator[dict]:
    """Training prompts for the dispatcher (disjoint seed stream from evaluation)."""
    rng = random.Random(seed * 7919 + 1)
    while True:
        prob = sample_problem(rng)
        yield {"prompt_ids": prob.prompt_ids(), "answer": prob.answer}


def arith_drift_prompts(seed: int, period: int = 4000, low: float = 1.3, high: float = 6.0):
    """The same task with a drifting length: the mean number of steps rises from ``low``
    to ``high`` over the first half of each ``period`` prompts and falls back over the
    second (responses grow, then shrink: what drives the allocator in tests)."""
    rng = random.Random(seed * 7919 + 2)
    i = 0
    while True:
        phase = (i % period) / period
        mean = low + (high - low) * (2 * phase if phase < 0.5 else 2 * (1 - phase))
        prob = sample_problem(rng, mean)
        yield {"prompt_ids": prob.prompt_ids(), "answer": prob.answer}
        i += 1


def eval_problems(n: int = 512, seed: int = 12345) -> list[Problem]:
    rng = random.Random(seed)
    return [sample_problem(rng) for _ in range(n)]
