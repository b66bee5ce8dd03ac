"""A GSM8K reward in verl's signature: this file works unchanged as verl's
``custom_reward_function`` and as ReFlow's ``workload.reward_fn``.

The answer is what follows the last ``####``, else the last number in the text; commas
and a trailing period are ignored. Beside the score it returns two diagnostics, which
ReFlow averages into each step's metrics (``reward_info/found``, ``reward_info/chars``).
"""

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        found = _NUMBER.search(tail)
    else:
        numbers = _NUMBER.findall(text)
        found = None
        if numbers:
            return numbers[-1].replace(",", "").rstrip(".")
    return found.group(0).replace(",", "").rstrip(".") if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = extract_answer(solution_str)
    correct = answer is not None and answer == str(ground_truth).replace(",", "")
    return {
        "score": 1.0 if correct else 0.0,
        "found": answer is not None,
        "chars": len(solution_str),
    }
