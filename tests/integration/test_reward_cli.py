"""`reflow reward math` as a user runs it: JSON Lines through stdin, in a subprocess."""

import json
import subprocess
import sys

from tests.helpers import DATA_SLICES, REPO, needs_full_data
from tests.helpers import SHARED_DATA as DATA


def test_reward_math_scores_gsm8k_lines_in_order_and_reports_bad_lines():
    gsm8k = DATA_SLICES / "gsm8k/test.jsonl"  # the first 40 records: the slice has them
    rows = [json.loads(x) for x in gsm8k.read_text().splitlines()[:40]]
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


def _reward_code(lines: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reflow_cli.main", "reward", "code", "--workers", "2", *args],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


@needs_full_data("the APPS sample (apps/apps_train_sample_coderl.jsonl)")
def test_reward_code_scores_apps_and_humaneval_lines_in_order():
    from runtime.data.datasets import load_records

    apps = load_records(DATA / "apps/apps_train_sample_coderl.jsonl")
    he = load_records(DATA / "humaneval/HumanEval.jsonl.gz")[:6]
    lines, expected = [], []
    for row in apps:
        io = json.loads(row["input_output"])
        good = json.loads(row["solutions"])[0]
        lines.append(json.dumps({"program": good, "tests": io}))
        expected.append((1.0, len(io["inputs"])))
        lines.append(json.dumps({"program": "print(0)\ndef is_prime(n): return 0", "tests": io}))
        expected.append((0.0, len(io["inputs"])))
    for r in he:
        prog = r["prompt"] + r["canonical_solution"]
        lines.append(
            json.dumps({"program": prog, "test": r["test"], "entry_point": r["entry_point"]})
        )
        expected.append((1.0, 1))
    lines.insert(3, '{"program": 5, "tests": {}}')
    expected.insert(3, (None, None))
    done = _reward_code(lines)
    assert done.returncode == 0, done.stderr
    out = [json.loads(x) for x in done.stdout.splitlines()]
    assert [(o["score"], o.get("total")) for o in out] == expected
    assert out[3]["error"] == "line 4: field 'program' must be a string"
    assert all(o["error"] for o in out if o["score"] == 0.0)


def test_reward_code_bad_recipe_is_one_line(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("sandbox:\n  memory_mb: 1\n")
    done = _reward_code(['{"program": "print(1)", "test": ""}'], "--recipe", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "sandbox.memory_mb" in done.stderr


def test_reward_code_grades_leetcode_lines_and_one_bad_program_costs_only_its_line():
    from runtime.data.datasets import load_records

    rows = load_records(DATA_SLICES / "leetcode/LeetCodeDataset-v0.2.0-test.jsonl.gz")[:3]
    lines = [
        json.dumps(
            {
                "program": r["completion"],
                "test": r["test"],
                "entry_point": r["entry_point"],
                "preamble": r["prompt"],
            }
        )
        for r in rows
    ]
    digits = "9" * 5000
    big = {"program": "print(10 ** 5000 - 1)", "tests": {"inputs": [""], "outputs": [digits]}}
    lines.insert(1, json.dumps(big))  # 5,000 digits: it ended the batch with no line answered
    wrong = {"program": "def f(x):\n    return x + 1", "test": "assert f(1) == 1"}
    lines.append(json.dumps(wrong))
    done = _reward_code(lines, "--explain")
    assert done.returncode == 0, done.stderr
    out = [json.loads(x) for x in done.stdout.splitlines()]
    assert [o["score"] for o in out] == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert out[0]["tests"] == ["test 0: ok"]
    assert out[-1]["tests"] == ["test 0: wrong_answer: AssertionError at assert f(1) == 1"]
