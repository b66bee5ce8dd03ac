#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): on one lent GPU, in one call and about 8 minutes, the
# `gpu` tests that need one GPU and no vLLM, then benchmarks/gpu_check.py (the trainer on
# Qwen3-shaped models: tokens/s, MFU, peak memory against the memory plan; copy rates; a
# role switch's phases). Everything lands as JSON and text under --out (default $OUT).
#
#   bash scripts/gpu-check.sh --fetch     # here: the wheels the GPU machine lacks, into .whl/
#   bash scripts/gpu-check.sh --dry-run   # here: the same script on the CPU, tiny models
#   bash scripts/gpu-check.sh             # there, with .whl carried
set -uo pipefail

die() {
    echo "gpu-check: $*" >&2
    exit 2
}

usage() {
    cat <<'EOF'
usage: scripts/gpu-check.sh [--fetch] [--dry-run] [--out DIR] [--models A,B] [--total-s N]
  --fetch      download the project's small dependencies missing on the GPU machine
               (Python 3.12, manylinux x86_64 wheels) into .whl/, then stop
  --dry-run    run everything on the CPU with the tiny embedded models
  --out DIR    where the JSON and logs go (default: $OUT, else gpu-check-out/)
  --models     which models the trainer part trains (default: 0.6b,1.7b,4b; dry run: tiny,small)
  --total-s N  the whole check's seconds, tests included (default 450)
EOF
}

is_int() { [[ $1 =~ ^[0-9]+$ ]]; }

DRY=0
FETCH=0
OUTDIR=${OUT:-gpu-check-out}
MODELS=""
TOTAL_S=450
TESTS_S=150 # the gpu tests' share of it
while [ $# -gt 0 ]; do
    case $1 in
    --dry-run) DRY=1 ;;
    --fetch) FETCH=1 ;;
    --out)
        [ $# -ge 2 ] && [ -n "$2" ] || die "--out: needs a folder"
        OUTDIR=$2
        shift
        ;;
    --models)
        [ $# -ge 2 ] && [[ $2 =~ ^[a-z0-9.]+(,[a-z0-9.]+)*$ ]] || die "--models: a comma-separated list of names"
        MODELS=$2
        shift
        ;;
    --total-s)
        [ $# -ge 2 ] && is_int "$2" && [ "$2" -ge 60 ] || die "--total-s: a whole number of seconds, at least 60"
        TOTAL_S=$2
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
    esac
    shift
done

cd "$(dirname "$0")/.." || die "cannot enter the repository"
REPO=$(pwd)

if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python # here; the GPU machine gets no .venv and uses its own python3
else
    PY=python3
fi

# What the GPU machine's image lacks of setup.cfg's install_requires (it has torch,
# transformers, msgpack, typer, rich, pyyaml, numpy, pyarrow, tensorboard, pytest),
# pinned to what `make install` resolves here. vLLM is not among them: its CUDA build is
# far larger than a call can carry.
WHEELS=(
    pyzmq==27.3.0
    submitit==1.5.4
    math-verify==0.9.0
    latex2sympy2_extended==1.11.0
    antlr4-python3-runtime==4.13.2
)
WHEEL_LIMIT_MIB=40

if [ $FETCH = 1 ]; then
    rm -rf .whl && mkdir -p .whl
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
        platforms+=(--platform "$p")
    done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}" || die "--fetch: pip download failed"
    mib=$(du -sm .whl | cut -f1)
    [ "$mib" -le $WHEEL_LIMIT_MIB ] || die "--fetch: .whl/ is $mib MiB, over $WHEEL_LIMIT_MIB"
    echo "gpu-check: $(ls .whl | wc -l) wheels, $mib MiB in .whl/ (carry it: run(carry=['.whl']))"
    ls .whl
    exit 0
fi

mkdir -p "$OUTDIR" || die "--out: cannot make $OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') || die "no Python at $PY"
if compgen -G ".whl/*.whl" >/dev/null; then
    if [ "$pyver" = 3.12 ]; then
        SITE=/tmp/reflow-gpu-check-site
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl || die "the carried wheels did not install"
        export PYTHONPATH=$PYTHONPATH:$SITE # after the repo; the image's own packages stay first
        echo "gpu-check: installed $(ls .whl | wc -l) carried wheels into $SITE"
    else
        echo "gpu-check: .whl/ holds Python 3.12 wheels and this is Python $pyver: not installed"
    fi
fi

start=$SECONDS
echo "gpu-check: the gpu tests (at most ${TESTS_S} s)"
per_test=()
# a hung test (an NCCL wait, say) fails alone where pytest-timeout is there (the GPU
# machine has it), so the others still run and the XML is written
"$PY" -c "import pytest_timeout" 2>/dev/null && per_test=(-p timeout --timeout 100)
timeout "$TESTS_S" "$PY" -m pytest tests/gpu -m gpu -p no:cacheprovider -q -o addopts="-ra --strict-markers" \
    "${per_test[@]}" --junitxml "$OUTDIR/gpu-tests.xml" >"$OUTDIR/gpu-tests.log" 2>&1
tests_rc=$?
tail -n 25 "$OUTDIR/gpu-tests.log"
[ $tests_rc = 124 ] && echo "gpu-check: the gpu tests ran past ${TESTS_S} s and were stopped"

left=$((TOTAL_S - (SECONDS - start)))
# no model starts in the last 150 s: the largest takes about that
budget=$((left > 200 ? left - 150 : 50))
args=(--out "$OUTDIR" --junit "$OUTDIR/gpu-tests.xml" --budget-s "$budget")
[ $DRY = 1 ] && args+=(--dry-run)
[ -n "$MODELS" ] && args+=(--models "$MODELS")
echo "gpu-check: the trainer check (${left} s left)"
timeout "$left" "$PY" benchmarks/gpu_check.py "${args[@]}" 2>&1 | tee "$OUTDIR/gpu-check.log" | grep -v -E "Loading weights|use_cache=True"
check_rc=${PIPESTATUS[0]}
[ "$check_rc" = 124 ] && echo "gpu-check: the trainer check ran past its time; gpu-check.json holds the parts that ended"
# tests: 0 all passed, 5 none collected; anything else is a failure worth the exit code
if [ "$check_rc" != 0 ] || { [ $tests_rc != 0 ] && [ $tests_rc != 5 ]; }; then
    exit 1
fi
