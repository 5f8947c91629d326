#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for the tests and for trying the Slurm commands locally.
#
#   sudo bash tools/slurm_local.sh start    # install (Debian/Ubuntu) if missing, configure, start; prints the export line
#   bash tools/slurm_local.sh status        # exit 0 when the cluster answers
#   sudo bash tools/slurm_local.sh stop     # cancel every job, stop slurmctld, slurmd and munged
#
# Everything it writes lives in one folder, ${CONDINIT_SLURM_DIR:-/tmp/condinit-slurm}: slurm.conf, state,
# spool, logs, pid files and its own munged socket, so it neither needs nor touches /etc/slurm. The munge
# key is the system one, /etc/munge/munge.key (created when missing, owned by munge, mode 400).
# Clients find the cluster through SLURM_CONF=<dir>/slurm.conf. Accounting is off, so there is no sacct:
# finished jobs stay visible in `squeue --states=all` / `scontrol show job` for MinJobAge (300 s).
# `start` on a running cluster and `stop` on a stopped one do nothing.
set -euo pipefail

DIR="${CONDINIT_SLURM_DIR:-/tmp/condinit-slurm}"
CONF="$DIR/slurm.conf"
MUNGE_DIR="$DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_KEY=/etc/munge/munge.key
export SLURM_CONF="$CONF"

die() {
  echo "slurm_local: $*" >&2
  exit 1
}

pid_alive() {  # pid file -> 0 when the process it names is running
  [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

cluster_answers() {
  [[ -f "$CONF" ]] && command -v scontrol >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -q "is UP"
}

node_idle() {
  # "idle" or "mixed"/"allocated" once jobs run: anything but down/drained/unknown means the node serves jobs.
  local state
  state="$(timeout 10 sinfo -h -N -o %T 2>/dev/null | head -1)"
  [[ -n "$state" && "$state" != *down* && "$state" != *drain* && "$state" != *unk* && "$state" != *not_resp* ]]
}

install_if_missing() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
      && command -v sbatch >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and this is not Debian/Ubuntu (no apt-get); install them with your package manager"
  echo "slurm_local: installing slurm-wlm and munge (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq slurm-wlm munge >/dev/null || die "apt-get install slurm-wlm munge failed"
}

munge_key() {
  if [[ ! -s "$MUNGE_KEY" ]]; then
    mkdir -p "$(dirname "$MUNGE_KEY")"
    dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
  fi
  chown munge:munge "$(dirname "$MUNGE_KEY")" "$MUNGE_KEY"
  chmod 700 "$(dirname "$MUNGE_KEY")"
  chmod 400 "$MUNGE_KEY"
}

write_conf() {
  local host cpus mem_mb node_line
  host="$(hostname -s)"
  # The node as slurmd sees it (CPUs, sockets, cores, threads), so it is never drained for a mismatch;
  # RealMemory at 90% of the host's leaves the OS its share while any sensible --mem fits.
  node_line="$(slurmd -C | head -1 | sed -E 's/ RealMemory=[0-9]+//')"
  mem_mb="$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
  cpus="$(sed -nE 's/.* CPUs=([0-9]+).*/\1/p' <<<"$node_line")"
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
  cat >"$CONF" <<EOF
# One-node cluster written by tools/slurm_local.sh for host $host ($cpus CPUs, ${mem_mb} MB).
ClusterName=condinit
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it runs again (default 120 s).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs stay in squeue --states=all / scontrol show job for 5 minutes (there is no sacct).
MinJobAge=300
# Requeued jobs (scontrol requeue, submitit's requeue on the time-limit signal) are allowed.
JobRequeue=1
# SIGTERM, then SIGKILL this many seconds later: room to write a checkpoint on scancel/preemption.
KillWait=5
# Schedule quickly: a one-node test cluster has nothing to batch up.
SchedulerParameters=sched_interval=1,bf_interval=1
MessageTimeout=10
$node_line RealMemory=$mem_mb State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munged() {
  mkdir -p "$MUNGE_DIR"
  chown munge:munge "$MUNGE_DIR"
  chmod 755 "$MUNGE_DIR"  # clients need to reach the socket
  pid_alive "$MUNGE_DIR/munged.pid" && return
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
    --log-file="$MUNGE_DIR/munged.log" --pid-file="$MUNGE_DIR/munged.pid" --seed-file="$MUNGE_DIR/munged.seed" \
    || die "munged did not start; see $MUNGE_DIR/munged.log"
}

wait_for() {  # seconds, description, command...
  local seconds="$1" what="$2"
  shift 2
  for _ in $(seq "$((seconds * 2))"); do
    "$@" && return 0
    sleep 0.5
  done
  die "$what after ${seconds} s; logs in $DIR/log"
}

start() {
  if cluster_answers && node_idle; then
    echo "slurm_local: already running ($DIR)" >&2
    echo "export SLURM_CONF=$CONF"
    return
  fi
  [[ "$(id -u)" == 0 ]] || die "start needs root (it installs packages and runs slurmctld/slurmd as root)"
  install_if_missing
  munge_key
  write_conf
  start_munged
  wait_for 10 "munged does not answer" test -S "$MUNGE_SOCKET"
  pid_alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  wait_for 30 "slurmctld does not answer" cluster_answers
  pid_alive "$DIR/run/slurmd.pid" || slurmd -f "$CONF" || die "slurmd did not start; see $DIR/log/slurmd.log"
  wait_for 60 "the node did not become idle" node_idle
  echo "slurm_local: one-node Slurm up ($(sinfo -h -o '%P %D node, %c CPUs, %m MB, %T'))" >&2
  echo "export SLURM_CONF=$CONF"
}

stop() {
  if cluster_answers; then
    # Jobs first: slurmstepd outlives a slurmd shutdown, and nothing may be left running.
    scancel --full --quiet $(squeue -h -o %A -t RUNNING,PENDING,SUSPENDED,REQUEUED,COMPLETING) 2>/dev/null || true
    for _ in $(seq 40); do
      [[ -z "$(squeue -h -o %A -t RUNNING,COMPLETING,SUSPENDED)" ]] && break
      sleep 0.5
    done
    timeout 20 scontrol shutdown >/dev/null 2>&1 || true
  fi
  local pidfile pid
  for pidfile in "$DIR/run/slurmd.pid" "$DIR/run/slurmctld.pid" "$MUNGE_DIR/munged.pid"; do
    pid_alive "$pidfile" || continue
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$DIR/run/slurmd.pid" "$DIR/run/slurmctld.pid"
  echo "slurm_local: stopped ($DIR)" >&2
}

status() {
  if cluster_answers; then
    sinfo -h -o "slurm_local: running, partition %P: %D node %N, %c CPUs, %m MB, %T"
    echo "export SLURM_CONF=$CONF"
  else
    echo "slurm_local: not running ($DIR)"
    return 1
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 start|stop|status (got '${1:-}')" ;;
esac
