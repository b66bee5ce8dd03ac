"""`reflow reward math` as a user runs it: JSON Lines through stdin, in a subprocess."""

import json
import subprocess
import sys

from tests.conftest import REPO, needs_shared_data
from tests.conftest import SHARED_DATA as DATA


@needs_shared_data
def test_reward_math_scores_gsm8k_lines_in_order_and_reports_bad_lines():
    rows = [json.loads(x) for x in (DATA / "gsm8k/test.jsonl").read_text().splitlines()[:40]]
    lines, expected = [], []
    for i, r in enumerate(rows):
        final = int(r["answer"].split("####")[-1].replace(",", ""))
        given = final if i % 2 == 0 else final + 3  # every other response is wrong
        lines.append(json.dumps({"response": f"... so \\boxed{{{given}}}", "gold": r["answer"]}))
        expected.append({"score": 1.0 if i % 2 == 0 else 0.0})
    lines.insert(7, "{broken")
    expected.insert(
        7,
        {
            "score": None,
            "error": "line 8: not valid JSON (Expecting property name enclosed in double quotes)",
        },
    )
    done = subprocess.run(
        [sys.executable, "-m", "reflow_cli.main", "reward", "math", "--workers", "2"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=True,
    )
    assert [json.loads(x) for x in done.stdout.splitlines()] == expected
