#!/usr/bin/env bash
# A single-node Slurm on localhost for the live Slurm tests (tests/test_slurm.py).
# Idempotent and never fails CI: anything missing leaves the live tests skipped with a reason.
#   .ci/slurm-setup.sh            install (Debian's slurm-wlm + munge, as root) and write the config
#   .ci/slurm-setup.sh --start    also start munged, slurmctld and slurmd and wait for the node
# Config: proctrack/linuxproc, task/none, no cgroups, no accounting daemon (sacct needs slurmdbd,
# which needs a MySQL server: the tests replay recorded sacct outputs instead).
set -u
CONF_DIR=/etc/slurm
NODE=$(hostname -s)
CPUS=$(nproc)

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null 2>&1 || true
        apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || true
    fi
fi
command -v slurmctld >/dev/null 2>&1 || { echo "slurm-setup: slurmctld not installed (needs root + apt-get)"; exit 0; }

mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge 2>/dev/null || true
cat > "$CONF_DIR/slurm.conf" <<EOF
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=3600
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; chmod 400 /etc/munge/munge.key; }
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true

[ "${1:-}" = "--start" ] || exit 0
pgrep -x munged >/dev/null || (runuser -u munge -- munged --force 2>/dev/null || munged --force 2>/dev/null) || true
pgrep -x slurmctld >/dev/null || slurmctld 2>/dev/null || true
pgrep -x slurmd >/dev/null || slurmd 2>/dev/null || true
for _ in $(seq 30); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then echo "slurm-setup: node $NODE up"; exit 0; fi
    scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
    sleep 1
done
echo "slurm-setup: the node did not come up within 30 s; see /var/log/slurm/*.log"
exit 0
