"""Multi-turn coding agent (APPS-style): write a program, run it against the public tests
in the sandbox, read the first failure as the next user turn, try again, up to
``workload.max_turns`` attempts; the reward is the last program's result on the hidden
tests. Feedback tokens are environment tokens (loss mask 0).

The split (:func:`split_tests`): the first ``workload.public_tests`` tests are public, but
never all of them, so at least one test stays hidden and the two sets never overlap. A
task with a single test (every HumanEval task, as its ``check`` is one test) has no
public test at all: one attempt, no feedback turn, scored on that test. Feedback only
ever shows public tests, so it cannot reveal a hidden one (docs/code-reward.md)."""

from __future__ import annotations

from typing import Any

from runtime.workloads.agents import scoring
from runtime.workloads.agents.base import AgentEnv, Episode
from runtime.workloads.rewards.code import extract_program, parse_tests, tests_of


def feedback_text(result: dict[str, Any] | None, error: str | None) -> str:
    """The user turn after a failed attempt: what was run, what was expected, what came."""
    if result is None:
        return f"Running your program failed: {error}. Fix it and write the whole program."
    f = result.get("failure") or {}
    lines = [f"Your program passed {result['passed']} of {result['total']} public tests."]
    if f:
        lines.append(f"Failed test ({f['status']}):")
        if f.get("input") is not None:
            lines.append(f"input: {_clip(f['input'])}")
        if f.get("expected") is not None:
            lines.append(f"expected: {_clip(f['expected'])}")
        lines.append(f"got: {_clip(f['got'])}")
    lines.append("Fix it and write the whole program in a ```python block.")
    return "\n".join(lines)


def _clip(x: Any, n: int = 300) -> str:
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


def split_tests(total: int, public_tests: int) -> tuple[list[int], list[int]]:
    """(public, hidden) test indices: at most ``total - 1`` public ones, the rest hidden."""
    k = max(0, min(public_tests, total - 1))
    return list(range(k)), list(range(k, total))


class CodeAgent:
    async def run(self, env: AgentEnv, request_id: str, prompt: dict[str, Any]) -> Episode | None:
        w, settings = env.config.workload, env.config.sandbox
        record = env.record(prompt)
        tests, fn_name = tests_of(record), record.get("fn_name") or None
        total = parse_tests(tests, fn_name=fn_name).total
        public, hidden = split_tests(total, w.public_tests)
        ep = env.episode(request_id, prompt)
        program = ""
        for turn in range(w.max_turns):
            g = await env.generate(ep, f"{request_id}-t{turn}")
            if g is None:
                break  # no room left in the context
            if g.finish == "abort":
                return None
            ep.add_model(g)
            ep.info["turns"] = turn + 1
            program = extract_program(env.codec.decode(g.tokens))
            if not public or turn == w.max_turns - 1:
                break
            result, error = await env.call(
                scoring.code_score,
                program,
                tests,
                fn_name,
                public,
                settings,
                w.reward_timeout_s,
                on_thread=True,
            )
            if result is not None and result["score"] == 1.0:
                ep.info["public_passed_at"] = turn + 1
                break
            ids = env.codec.user_turn_ids(feedback_text(result, error), g.finish == "stop")
            if len(ep.context) + len(ids) >= env.config.max_seq_len:
                break
            ep.add_env(ids)
        if await env.custom_reward(ep, prompt):  # the recipe's own reward replaces the tests'
            return ep
        result, error = await env.call(
            scoring.code_score,
            program,
            tests,
            fn_name,
            hidden,
            settings,
            w.reward_timeout_s,
            on_thread=True,
        )
        ep.reward = float(result["score"]) if result else 0.0
        ep.info["hidden_passed"] = result["passed"] if result else 0
        ep.info["hidden_total"] = len(hidden)
        if error:
            ep.info["reward_error"] = error
        elif result and result.get("error"):
            ep.info["test_error"] = result["error"]  # why it scored 0: the first failure
        return ep
