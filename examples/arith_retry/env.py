"""A multi-turn environment the embedded arithmetic model can learn on a CPU: two tries at
a sum.

The prompt is the embedded task's (``S3+4+5=``). After a wrong final answer the
environment replies ``?`` and the model tries again. Reward 1 for a right answer at the
first try, 0.5 at the second, else 0.
"""

from __future__ import annotations

from runtime.embedded.arith import reward
from runtime.workloads.agents.environment import Environment, Step, Tools


class ArithRetry(Environment):
    def reset(self, record: dict, tools: Tools) -> None:
        self.answer = int(record["answer"])
        self.tries = 0

    def step(self, action: str) -> Step:
        self.tries += 1
        if reward(action, self.answer) == 1.0:
            return Step(reward=1.0 / self.tries, done=True, info={"tries": float(self.tries)})
        return Step(observation="?", info={"tries": float(self.tries)})
