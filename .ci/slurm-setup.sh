#!/usr/bin/env bash
# A single-node Slurm on localhost for the live Slurm tests (tests/test_slurm.py).
# Idempotent and never fails CI: anything missing leaves the live tests skipped with a reason.
#   .ci/slurm-setup.sh                install (Debian's slurm-wlm + munge, as root) and write the config
#   .ci/slurm-setup.sh --start        also start munged, slurmctld and slurmd and wait for the node
#   .ci/slurm-setup.sh --accounting   also install MariaDB + slurmdbd so that sacct works (~25 s more);
#                                     once set up, --start starts them too
# Config: proctrack/linuxproc, task/none (no cgroups); jobacct_gather/linux with OverMemoryKill
# (a job over --mem is killed: FAILED 0:9); partitions debug (default) and urgent, which preempts
# debug (PreemptMode=CANCEL: the debug job ends PREEMPTED).
set -u
CONF_DIR=/etc/slurm
NODE=$(hostname -s)
CPUS=$(nproc)
MEM=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
START=0; ACCT=0
for arg in "$@"; do
    case "$arg" in --start) START=1;; --accounting) ACCT=1;; esac
done
[ -s "$CONF_DIR/slurmdbd.conf" ] && command -v slurmdbd >/dev/null 2>&1 && command -v mariadbd >/dev/null 2>&1 && ACCT=1

install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq >/dev/null 2>&1 || true; APT_UPDATED=1; }
        apt-get install -y -qq "$@" >/dev/null 2>&1 || true
    fi
}
command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || install slurm-wlm munge
command -v slurmctld >/dev/null 2>&1 || { echo "slurm-setup: slurmctld not installed (needs root + apt-get)"; exit 0; }
if [ "$ACCT" = 1 ] && ! { command -v slurmdbd >/dev/null 2>&1 && command -v mariadbd >/dev/null 2>&1; }; then
    install slurmdbd mariadb-server
    command -v slurmdbd >/dev/null 2>&1 && command -v mariadbd >/dev/null 2>&1 || { echo "slurm-setup: no slurmdbd/mariadb: sacct stays off"; ACCT=0; }
fi

mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge 2>/dev/null || true
if [ "$ACCT" = 1 ]; then
    STORAGE="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost"
    cat > "$CONF_DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm-ci
StorageLoc=slurm_acct_db
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
EOF
    chmod 600 "$CONF_DIR/slurmdbd.conf"
else
    STORAGE="AccountingStorageType=accounting_storage/none"
fi
cat > "$CONF_DIR/slurm.conf" <<EOF
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherParams=OverMemoryKill
JobAcctGatherFrequency=1
$STORAGE
JobCompType=jobcomp/none
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
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
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP PriorityTier=1 OverSubscribe=NO
PartitionName=urgent Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=10 OverSubscribe=NO
EOF
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; chmod 400 /etc/munge/munge.key; }
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true

[ "$START" = 1 ] || exit 0
pgrep -x munged >/dev/null || (runuser -u munge -- munged --force 2>/dev/null || munged --force 2>/dev/null) || true
if [ "$ACCT" = 1 ]; then
    if ! pgrep -x mariadbd >/dev/null; then
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null
        (mariadbd --user=mysql --bind-address=127.0.0.1 --pid-file=/run/mysqld/mysqld.pid >/var/log/slurm/mariadb.log 2>&1 &)
    fi
    for _ in $(seq 40); do mariadb -e 'select 1' >/dev/null 2>&1 && break; sleep 0.5; done
    mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE OR REPLACE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm-ci';
                GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;" 2>/dev/null || true
    pgrep -x slurmdbd >/dev/null || slurmdbd 2>/dev/null || true
    for _ in $(seq 40); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
    sacctmgr -n list cluster format=cluster 2>/dev/null | grep -qw ci || sacctmgr -i add cluster ci >/dev/null 2>&1 || true
fi
pgrep -x slurmctld >/dev/null || slurmctld 2>/dev/null || true
pgrep -x slurmd >/dev/null || slurmd 2>/dev/null || true
for _ in $(seq 30); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then echo "slurm-setup: node $NODE up"; exit 0; fi
    sleep 1
done
echo "slurm-setup: the node did not come up within 30 s; see /var/log/slurm/*.log"
exit 0
