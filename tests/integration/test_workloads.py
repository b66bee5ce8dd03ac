"""The three workloads' CPU recipes end to end: real vLLM (CPU build) with the embedded chat
model, real data (the slices shipped in recipes/data), the real sandbox; a few steps each. The
trajectories (``logging.samples``) are checked token by token: what the model wrote is
trained on, what the environment wrote (test feedback, tool output) is masked and is exactly
what the environment produced."""

from __future__ import annotations

import itertools
import json
import re
import shutil

import pytest

from tests.helpers import REPO, reflow

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap not installed"),
]


@pytest.fixture(scope="module")
def codec():
    from runtime.data.codec import ChatCodec
    from runtime.embedded.tiny_chat import embedded_chat_model_path

    return ChatCodec(str(embedded_chat_model_path()))  # built once here, not in a rank


def run_recipe(name: str, runs_dir) -> tuple[dict, list[dict]]:
    recipe = str(REPO / "recipes" / f"{name}.yaml")
    done = reflow("launch", recipe, "--local", "--wait", timeout=900)
    run_dir = next(runs_dir.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert summary["state"] == "COMPLETED" and summary["samples"]["lost"] == 0
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:  # the wire's invariants, re-checked on what rank 0 kept
        mask = s["loss_mask"] or [1] * len(s["token_ids"])
        assert len(mask) == len(s["token_ids"]) and sum(mask) == s["n_valid"]
    return summary, samples


def segments(s: dict) -> list[tuple[int, list[int]]]:
    out: list[tuple[int, list[int]]] = []
    for t, m in zip(s["token_ids"], s["loss_mask"] or [1] * len(s["token_ids"]), strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(t)
        else:
            out.append((m, [t]))
    return out


# About a minute of real engines: make test-slow (CI's 45 minutes). Single-turn generation
# runs in make test on the demo's real engines; the math reward on every GSM8K and MATH-500
# answer in tests/unit/test_math_reward.py.
@pytest.mark.slow
def test_math_recipe_single_turn(runs_dir, codec):
    _, samples = run_recipe("dapo_math_cpu", runs_dir)
    assert all(s["loss_mask"] is None and s["info"]["turns"] == 1 for s in samples)
    assert all(s["reward"] in (0.0, 1.0) for s in samples)


def test_code_agent_recipe_multi_turn_with_masked_feedback(runs_dir, codec):
    _, samples = run_recipe("apps_coding_cpu", runs_dir)
    multi = [s for s in samples if s["info"]["turns"] > 1]
    assert multi, "no sample went past its first attempt"
    for s in multi:
        segs = segments(s)
        assert [m for m, _ in segs] == [1, 0] * (s["info"]["turns"] - 1) + [1]
        for m, ids in segs:
            if m == 1:
                continue
            text = codec.tok.decode(ids)  # special tokens included
            # exactly the user turn the agent wrote: ChatML around the test feedback
            closed = not text.startswith("<|im_end|>")
            body = re.match(
                r"(?:<\|im_end\|>)?\n<\|im_start\|>user\n(.*)<\|im_end\|>\n"
                r"<\|im_start\|>assistant\n$",
                text,
                re.S,
            )
            assert body, text
            assert ids == codec.user_turn_ids(body.group(1), closed)
            assert body.group(1).startswith("Your program passed 0 of 1 public tests.")
        assert s["info"]["hidden_total"] >= 1 and s["info"]["hidden_passed"] >= 0


OPEN = "\n<interpreter>\n"


def test_tool_recipe_runs_code_mid_reasoning(runs_dir, codec):
    from runtime.config.recipe import load_recipe
    from runtime.workloads.agents.scoring import run_snippet
    from runtime.workloads.agents.tool_reasoning import tool_output_text

    sandbox = load_recipe(REPO / "recipes" / "retool_cpu.yaml").sandbox
    # The sandbox computes: an arithmetic oracle that does not depend on what the model writes.
    assert tool_output_text(run_snippet("print(33 - 1)", sandbox), None) == (
        f"{OPEN}32\n</interpreter>\n"
    )
    _, samples = run_recipe("retool_cpu", runs_dir)
    called = [s for s in samples if s["info"]["tool_calls"] > 0]
    assert called, "the warm-started model made no tool call"
    checked = 0
    for s in called:
        segs = segments(s)
        for (m, ids), (m_next, out_ids) in itertools.pairwise(segs):
            if m != 1 or m_next != 0:
                continue
            code_text = codec.decode(ids)  # as the agent reads it: special tokens dropped
            assert code_text.endswith("</code>")  # generation stopped at the close tag
            out = codec.tok.decode(out_ids)
            assert out_ids == codec.encode(out)
            code = code_text.rsplit("<code>", 1)[1].rsplit("</code>", 1)[0]
            # Every call: the context got exactly what the sandbox prints for exactly the
            # code the model wrote (mostly SyntaxErrors: the model is tiny). Which code it
            # writes differs across machines, so no call's content is counted on. A call
            # that hit a limit or the pool's own timeout is timing, not content: not compared.
            rerun = run_snippet(code, sandbox)
            limit_hit = re.search(r"\[[a-z_]+\]\n</interpreter>\n$", out)  # [timeout]...
            if rerun.status not in ("ok", "error") or limit_hit or out.startswith(f"{OPEN}error: "):
                continue
            assert out == tool_output_text(rerun, None), code
            # (0|[1-9]\d*): "08" is a SyntaxError in Python 3, which the sandbox reports
            simple = re.fullmatch(r"print\((0|[1-9]\d*) ([-+*]) (0|[1-9]\d*)\)", code)
            if simple:  # and where the answer is known, it is the right one
                a, op, b = int(simple[1]), simple[2], int(simple[3])
                value = {"+": a + b, "-": a - b, "*": a * b}[op]
                assert out == f"{OPEN}{value}\n</interpreter>\n"
            checked += 1
    assert checked > 0
