"""A sample is declared once (runtime/data/sample.py): adding a per-token field there is the
whole change for it to travel, be checked and be kept. The test makes that one-line change
in a copy of ``runtime/`` and sends a sample through every message and a checkpoint."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LINE = '    entropy: Sequence[float] = field(default=(), metadata=per_token("f"))\n'

SCRIPT = textwrap.dedent(
    """
    import dataclasses
    from runtime.data.micro_batches import rank_plans
    from runtime.data.sample import Batch, Sample, sample_from_state, sample_state
    from runtime.transport import frames as wire, protocol as p

    s = Sample(sample_id=1, group_id=0, prompt_id=0, versions=[(0, 0, 3)],
               prompt_token_ids=[5], token_ids=[1, 2, 3], logprobs=[-1.0, -2.0, -3.0],
               entropy=[0.5, 0.25, 0.125], n_valid=3, reward=1.0)
    got = wire.sample(p.decode(p.encode(wire.sample_done(s, 2))))
    assert list(got.entropy) == [0.5, 0.25, 0.125], got.entropy
    assert sample_from_state(sample_state(got)).entropy == [0.5, 0.25, 0.125]
    b = Batch(0, 0, [got], 1, 0)
    (part,) = rank_plans([4], [3], [False], 1, 1, None)
    for msg in (wire.batch_message(b), wire.batch_message(b, part)):
        (t,) = wire.batch(p.decode(p.encode(msg))).samples
        assert t.entropy == [0.5, 0.25, 0.125], t.entropy
    short = dataclasses.replace(wire.sample_done(s, 2))
    frames = p.encode(short)
    try:  # a value short: refused by the envelope
        p.decode([*frames[:-2], frames[-2][:-4], frames[-1]])  # the last is the routes blob
    except p.ProtocolError as exc:
        assert "frame sizes differ" in str(exc), exc
    else:
        raise AssertionError("a short entropy frame was taken")
    print("ok", len(frames) - 1)
    """
)


def test_a_per_token_field_is_one_declaration(tmp_path):
    shutil.copytree(
        REPO / "runtime", tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__")
    )
    sample_py = tmp_path / "runtime" / "data" / "sample.py"
    text = sample_py.read_text()
    anchor = '    logprobs: Sequence[float] = field(metadata=per_token("f"))\n'
    assert anchor in text  # the declaration this test extends
    sample_py.write_text(text.replace(anchor, anchor + LINE))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # token ids, log-probs, the new frame and the routes (runtime/data/routes.py)
    assert out.stdout.split() == ["ok", "4"]
