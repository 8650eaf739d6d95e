#!/bin/bash
# A real Slurm 22.05 cluster of NODES nodes on one machine (Debian 12, as root, no systemd), for tests:
# one slurmctld and one slurmd per node, all on 127.0.0.1 with their own ports (slurmd -N NAME; Debian's
# build allows several slurmd per host). No accounting (sacct unavailable), as on many real clusters.
#
#   slurm-cluster.sh start DIR [NODES] [CPUS_PER_NODE]   # prints: export SLURM_CONF=DIR/slurm.conf
#   slurm-cluster.sh stop DIR
#
# Every file lives under DIR (config, spool, logs, pids); nothing in /etc/slurm is touched. Clients find
# the cluster through SLURM_CONF. Node names are node1..nodeN. Seen working here: sinfo shows both nodes
# idle about 3 s after start; `srun -N2 -n2 hostname` and `sbatch -N2` run one task per node; squeue
# --json answers (OpenAPI v0.0.38). A finished job stays visible to scontrol/squeue for MinJobAge
# (set to 600 s here); after that only what the job itself wrote remains.
#
# Options (environment), for tests that need them:
#   SLURM_CLUSTER_MIN_JOB_AGE=S   MinJobAge (default 600); a small value lets a finished job leave squeue
#                                 soon (slurmctld purges old jobs about once a minute, so within S + ~60 s)
#   SLURM_CLUSTER_KILL_WAIT=S     KillWait: seconds between SIGTERM and SIGKILL at cancel/timeout (default 30)
#   SLURM_CLUSTER_PART_NODES=K    the partition "debug" holds only the first K nodes (default: all)
set -euo pipefail
cmd=${1:?start|stop}; dir=${2:?directory}
mkdir -p "$dir"; dir=$(cd "$dir" && pwd)

stop() {
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null || true
  done
}

if [[ $cmd == stop ]]; then stop; exit 0; fi

nodes=${3:-2}; cpus=${4:-1}
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null   # ~20 s
fi
mkdir -p /run/munge "$dir/ctld" "$dir/log"
[[ -f /etc/munge/munge.key ]] || mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f
chown -R munge:munge /run/munge /etc/munge /var/lib/munge /var/log/munge
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged

# Ports from the directory's name so that two clusters on one machine do not collide.
base=$((20000 + $(cksum <<<"$dir" | cut -d' ' -f1) % 20000))
host=$(hostname -s)
{
  echo "ClusterName=test$((base % 1000))"
  echo "SlurmctldHost=${host}(127.0.0.1)"
  echo "SlurmctldPort=$base"
  echo "SlurmUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "ReturnToService=2"
  echo "MinJobAge=${SLURM_CLUSTER_MIN_JOB_AGE:-600}"
  echo "KillWait=${SLURM_CLUSTER_KILL_WAIT:-30}"
  echo "SlurmdSpoolDir=$dir/spool-%n"
  echo "StateSaveLocation=$dir/ctld"
  echo "SchedulerType=sched/backfill"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "SlurmctldLogFile=$dir/log/slurmctld.log"
  echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
  echo "SlurmctldPidFile=$dir/slurmctld.pid"
  echo "SlurmdPidFile=$dir/slurmd-%n.pid"
  for i in $(seq 1 "$nodes"); do
    echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + i)) CPUs=$cpus RealMemory=2000 State=UNKNOWN"
  done
  part_nodes=ALL
  [[ -n ${SLURM_CLUSTER_PART_NODES:-} ]] && part_nodes="node[1-${SLURM_CLUSTER_PART_NODES}]"
  echo "PartitionName=debug Nodes=$part_nodes Default=YES MaxTime=INFINITE State=UP"
} >"$dir/slurm.conf"
for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool-node$i"; done

export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
for i in $(seq 1 "$nodes"); do slurmd -f "$SLURM_CONF" -N "node$i"; done
for _ in $(seq 1 30); do
  idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)
  [[ $idle -ge $nodes ]] && break
  sleep 1
done
[[ $idle -ge $nodes ]] || { echo "slurm: only $idle of $nodes nodes idle; see $dir/log" >&2; stop; exit 1; }
echo "export SLURM_CONF=$SLURM_CONF"
