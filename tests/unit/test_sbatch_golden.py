"""The sbatch script submitit renders for the APPS recipe on 8 nodes, against a golden file.

When a change to it is intended, regenerate the file and review the diff:

    REFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_sbatch_golden.py
"""

import os
from pathlib import Path

from jobs.slurm import render_sbatch
from runtime.config.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "apps_coding_8_nodes.sbatch"


def test_apps_coding_on_8_nodes_renders_the_golden_sbatch():
    cfg = load_recipe(REPO / "recipes" / "apps_coding.yaml", ["resources.nodes=8"])
    script = render_sbatch(cfg, cfg.name, Path("/runs/apps_coding-RUN/submitit"), "python3")
    if os.environ.get("REFLOW_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text(), (
        f"the rendered sbatch differs from {GOLDEN.relative_to(REPO)}; if the change is "
        "intended, regenerate it with REFLOW_UPDATE_GOLDEN=1 (see this file's docstring)"
    )
