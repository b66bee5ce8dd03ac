"""The math reward on real gold answers: every GSM8K test answer and every MATH-500
answer, written into a model-style response, scores 1; a perturbed one scores 0."""

import json

from runtime.workloads.rewards.math import gold_answer, math_reward
from tests.helpers import SHARED_DATA as DATA
from tests.helpers import needs_full_data


def records(name):
    return [json.loads(x) for x in (DATA / name).read_text().splitlines() if x.strip()]


def respond(answer: str) -> str:
    return f"Let me work through it step by step. ... so the answer is \\boxed{{{answer}}}."


@needs_full_data("all 1319 GSM8K test records")
def test_every_gsm8k_test_answer_scores_one_and_a_wrong_number_zero():
    wrong = []
    for r in records("gsm8k/test.jsonl"):
        final = gold_answer(r["answer"]).strip("$")
        if math_reward(respond(final), r["answer"]) != 1.0:
            wrong.append(("right answer scored 0", r["answer"][-40:]))
        if math_reward(respond(str(float(final) + 1)), r["answer"]) != 0.0:
            wrong.append(("wrong answer scored 1", final))
    assert wrong == []


@needs_full_data("MATH-500 (math500/test.jsonl)")
def test_every_math500_answer_scores_one_and_a_perturbed_one_zero():
    rows = records("math500/test.jsonl")
    assert len(rows) == 500
    right = [r["answer"] for r in rows if math_reward(respond(r["answer"]), r["answer"]) != 1.0]
    assert right == []
    perturbed = [
        r["answer"] for r in rows if math_reward(respond(r["answer"] + "+1"), r["answer"]) != 0.0
    ]
    assert perturbed == []


def test_no_answer_and_garbage_score_zero():
    assert math_reward("I do not know.", "#### 7") == 0.0
    assert math_reward("\\boxed{\\frac{", "$3$") == 0.0
    assert math_reward("so it is \\boxed{7}", "#### 7") == 1.0
