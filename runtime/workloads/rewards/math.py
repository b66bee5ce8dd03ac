"""Math answer reward through ``math-verify`` (Hugging Face's maintained grader): the
final answer is extracted from the response (``\\boxed{}`` first, then other answer
forms) and compared with the gold answer symbolically, so ``\\dfrac{14}{3}``, ``14/3``
and ``4.\\overline{6}`` all match ``\\frac{14}{3}``.

Gold answers come in dataset-specific forms; :func:`gold_answer` normalises the common
ones (GSM8K's ``#### 72`` rationale ending, a bare LaTeX expression, a number).
"""

from __future__ import annotations

import re
from typing import Any

_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


def gold_answer(gold: Any) -> str:
    """The gold answer as a LaTeX string math-verify can parse."""
    text = str(gold).strip()
    m = _GSM8K_FINAL.search(text)
    if m:  # GSM8K: rationale, then "#### 1,234"
        text = m.group(1).replace(",", "")
    if text.startswith("$") or "\\boxed" in text:
        return text
    return f"${text}$"


def math_reward(response: str, gold: Any) -> float:
    """1.0 when the response's final answer equals the gold answer, else 0.0."""
    from math_verify import parse, verify

    try:
        expected = parse(gold_answer(gold))
        predicted = parse(response)
        return 1.0 if expected and predicted and verify(expected, predicted) else 0.0
    except Exception:  # a grader error is a wrong answer, never a crashed worker
        return 0.0
