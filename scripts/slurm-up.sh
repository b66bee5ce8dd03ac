#!/usr/bin/env bash
# Start a single-host Slurm for ReFlow's `slurm` tests: slurmctld plus one slurmd per
# virtual node (n1..nN, all on this machine), munge authentication, no accounting
# database (a small sacct stand-in answers submitit's state queries instead).
# Runs as root without systemd; safe to run again (starts only what is not running).
#
#   REFLOW_SLURM_NODES   virtual nodes (default 2)
#   REFLOW_SLURM_BASE    state, spool and logs (default /tmp/reflow-slurm)
#   REFLOW_SLURM_CPUS    CPUs declared per node (default: nproc)
set -euo pipefail

NODES=${REFLOW_SLURM_NODES:-2}
BASE=${REFLOW_SLURM_BASE:-/tmp/reflow-slurm}
CPUS=${REFLOW_SLURM_CPUS:-$(nproc)}
CONF=/etc/slurm/slurm.conf
HERE=$(cd "$(dirname "$0")" && pwd)
say() { echo "slurm-up: $*"; }

if [ "$(id -u)" != 0 ]; then
  say "needs root (it starts munged, slurmctld and slurmd)"; exit 2
fi

# 1. Packages (Debian): the daemons, the client commands, munge.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

# 2. munge: a key, and munged running as its own user.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null || { say "munge does not work"; exit 1; }

# 3. Node names resolve to this machine (torch and submitit use the first node's name as
#    the rendezvous host): one marked line in /etc/hosts, rewritten in place.
names=$(seq -f 'n%g' 1 "$NODES" | tr '\n' ' ')
line="127.0.0.1 ${names}# reflow-slurm"
if ! grep -qxF "$line" /etc/hosts; then
  { grep -v '# reflow-slurm$' /etc/hosts || true; echo "$line"; } > /etc/hosts.reflow
  cat /etc/hosts.reflow > /etc/hosts && rm -f /etc/hosts.reflow  # same inode: may be a bind mount
fi

# 4. slurm.conf. A changed layout means a cold start with fresh job ids (submitit keys its
#    folders by job id, so ids must not repeat across cold starts).
mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
mkdir -p "$BASE"/state "$BASE"/spool "$BASE"/log /etc/slurm
conf=$(cat <<CONF
# written by reflow scripts/slurm-up.sh
ClusterName=reflow
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/slurmctld.pid
SlurmdPidFile=$BASE/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=n[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
if [ ! -f "$CONF" ] || [ "$(grep -v '^FirstJobId=' "$CONF")" != "$conf" ]; then
  "$HERE/slurm-down.sh" >/dev/null 2>&1 || true
  rm -rf "${BASE:?}"/state/* "${BASE:?}"/spool/*
  { echo "$conf"; echo "FirstJobId=$(( $(date +%s) % 50000000 + 1000 ))"; } > "$CONF"
fi

# 5. Daemons.
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
alive "$BASE/slurmctld.pid" || slurmctld -f "$CONF"
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
scontrol ping | grep -q 'is UP' || { tail -20 "$BASE/log/slurmctld.log"; exit 1; }
for n in $names; do
  mkdir -p "$BASE/spool/$n"
  alive "$BASE/slurmd-$n.pid" || slurmd -f "$CONF" -N "$n"
done
ready() { ! sinfo -h -N -o '%T' | grep -qvE '^(idle|mixed|allocated|completing)$'; }
for _ in $(seq 150); do ready && break; sleep 0.2; done
if ! ready; then
  scontrol update NodeName="n[1-$NODES]" State=RESUME 2>/dev/null || true
  sleep 1
fi
ready || { sinfo -N; say "nodes not ready"; exit 1; }

# 6. sacct stand-in (no slurmdbd here): submitit reads job states through sacct.
install -m 0755 "$HERE/sacct-standin" /usr/local/bin/sacct
say "up: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
