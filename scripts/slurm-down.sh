#!/usr/bin/env bash
# Stop what scripts/slurm-up.sh started: cancel the remaining jobs, then the daemons by
# their pid files (never by process name). munged is left running.
BASE=${REFLOW_SLURM_BASE:-/tmp/reflow-slurm}
stop() {
  [ -s "$1" ] || return 0
  local pid; pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$1"
}
if [ -s "$BASE/slurmctld.pid" ] && kill -0 "$(cat "$BASE/slurmctld.pid")" 2>/dev/null; then
  timeout 10 scancel --user="$(id -un)" >/dev/null 2>&1 || true
fi
for f in "$BASE"/slurmd-*.pid; do [ -e "$f" ] && stop "$f"; done
stop "$BASE/slurmctld.pid"
echo "slurm-down: stopped"
