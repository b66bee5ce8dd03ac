"""A held-out set's figures from its episodes' rewards: ``greedy``, ``mean@k`` and
``pass@k`` (runtime/workloads/eval_sets.py says what each means). Pure: the trainer-side
eval and rank 0's eval rounds (runtime/control/evals.py) both count with it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SetScores:
    """One set's rewards: the greedy one and the sampled ones, per prompt."""

    k: int
    solved_at: float
    greedy: list[float] = field(default_factory=list)
    sampled: list[list[float]] = field(default_factory=list)
    failed: int = 0  # episodes that ended without a score (aborted, or no room)

    def add(self, greedy: float, sampled: list[float]) -> None:
        if len(sampled) != self.k:
            raise ValueError(f"expected {self.k} sampled rewards, got {len(sampled)}")
        self.greedy.append(greedy)
        self.sampled.append(list(sampled))

    def metrics(self) -> dict[str, float]:
        """``greedy``, ``mean@k``, ``pass@k`` and ``prompts`` (empty with no prompt)."""
        n = len(self.greedy)
        if n == 0:
            return {}
        k = self.k
        return {
            "greedy": sum(self.greedy) / n,
            f"mean@{k}": sum(sum(s) / k for s in self.sampled) / n,
            f"pass@{k}": sum(pass_at_k(k, solved(s, self.solved_at), k) for s in self.sampled) / n,
            "prompts": float(n),
        }


def solved(rewards: list[float], at: float) -> int:
    return sum(1 for r in rewards if r >= at)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` of ``n`` samples, ``c`` of them correct, is
    correct (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
