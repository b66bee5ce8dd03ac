"""A multi-turn environment of one's own: guess the number.

The prompt names a range; the model answers with a number; the environment says
"higher" or "lower" until the model guesses right or runs out of turns. Reward 1 for the
right number, less for each guess it took, 0 if never found. A turn without a number is
told so, and costs a guess.
"""

from __future__ import annotations

import re

from runtime.workloads.agents.environment import Environment, Step, Tools

_NUMBER = re.compile(r"-?\d+")


class NumberGame(Environment):
    def reset(self, record: dict, tools: Tools) -> None:
        self.target = int(record["target"])
        self.guesses = 0

    def step(self, action: str) -> Step:
        self.guesses += 1
        found = _NUMBER.findall(action)
        if not found:
            return Step(observation="Answer with one number.", info={"no_number": 1.0})
        guess = int(found[-1])
        if guess == self.target:
            return Step(reward=1.0 / self.guesses, done=True, info={"guesses": self.guesses})
        return Step(observation="higher" if guess < self.target else "lower")
