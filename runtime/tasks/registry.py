"""Workloads by ``workload.kind``: their prompt stream and their reward."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class Task(Protocol):
    def prompts(self, seed: int) -> Iterator[dict[str, Any]]:
        """Prompt dicts with at least ``prompt_ids`` (token ids)."""
        ...

    def reward(self, response_ids: list[int], prompt: dict[str, Any]) -> float: ...


class ArithTask:
    def prompts(self, seed: int) -> Iterator[dict[str, Any]]:
        from runtime.tasks.arith import arith_prompts

        return arith_prompts(seed)

    def reward(self, response_ids: list[int], prompt: dict[str, Any]) -> float:
        from runtime.model.tiny_qwen3 import decode
        from runtime.tasks.arith import reward

        return reward(decode(response_ids), int(prompt["answer"]))


TASKS: dict[str, type] = {"arith": ArithTask}


def task(kind: str) -> Task:
    if kind not in TASKS:
        raise KeyError(f"workload.kind: {kind!r} has no implementation in this version")
    return TASKS[kind]()
