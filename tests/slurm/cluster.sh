#!/usr/bin/env bash
# Slurm test cluster for the maxent-grpo test suite and CI: one node on localhost, or N nodes,
# each a network namespace with its own hostname, on this one machine.
#
#   tests/slurm/cluster.sh start [--nodes N]  install (Debian slurm-wlm 22.05) if needed,
#                                             configure, start, wait until every node is idle
#   tests/slurm/cluster.sh stop               stop what this harness started, remove the network
#   tests/slurm/cluster.sh status             daemons + sinfo (exit 0 healthy, 3 otherwise)
#   tests/slurm/cluster.sh env                print `export SLURM_CONF=...` for `eval "$(...)"`
#   tests/slurm/cluster.sh kill-node NODE     SIGKILL every process of NODE (a node crash);
#                                             `start` brings it back
#   tests/slurm/cluster.sh cut-node NODE      take NODE's network link down (a silent node: its
#                                             processes run on, its peers hear nothing)
#   tests/slurm/cluster.sh restore-node NODE  bring NODE's network link back up
#   tests/slurm/cluster.sh node-pids NODE     pids of every process running on NODE
#
# One node (the default): the node is this host (`hostname -s`, 127.0.0.1), as before.
# N > 1 nodes: Debian's slurmd is built without --enable-multiple-slurmd, so each node is a
# network namespace "mgs-nodeI" (tests/slurm/netns.sh) with its own UTS namespace (hostname
# nodeI), its own /etc/hosts naming every node, and its own slurmd; slurmctld runs on the host
# at 10.213.7.1. The namespaces share the filesystem and the pid space, so paths are per node
# (%n) and munge's socket is shared.
# Starting with another node count than the running cluster's stops it first.
#
# Partitions (both on every node): "debug" (default, PriorityTier 1, GraceTime 30 s) and
# "high" (PriorityTier 2); PreemptType=preempt/partition_prio with PreemptMode=REQUEUE, so a job
# in "high" that needs the CPUs of a "debug" job gets them: the debug job is sent SIGTERM, then
# killed after the grace time and requeued.
#
# All configuration, spool, logs and pid files live in the state directory
# ${SLURM_TEST_DIR:-/tmp/maxent-grpo-slurm}; /etc/slurm is never touched. Daemons started by this
# harness are recorded in $STATE_DIR/run/harness-<key>.pid and the network objects in
# $STATE_DIR/run/net.list; `stop` (also run after a failed start) removes exactly those.
#
# Needs root, or passwordless sudo (CI runners), for apt-get, the daemons and the namespaces.
#
# Environment:
#   SLURM_TEST_DIR             state directory (default /tmp/maxent-grpo-slurm)
#   SLURM_TEST_START_TIMEOUT   seconds to wait for the nodes to become idle (default 60)
#   SLURM_TEST_STOP_TIMEOUT    seconds to wait for each daemon to exit on stop (default 30)
#   SLURM_TEST_SUBNET          first three octets of the multi-node /24 (default 10.213.7)
#   SLURM_TEST_SLURMD_TIMEOUT  SlurmdTimeout of a multi-node cluster (default 20): how soon a
#                              silent node is marked down
set -euo pipefail

export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${SLURM_TEST_DIR:-/tmp/maxent-grpo-slurm}"
START_TIMEOUT="${SLURM_TEST_START_TIMEOUT:-60}"
STOP_TIMEOUT="${SLURM_TEST_STOP_TIMEOUT:-30}"
ETC_DIR="${STATE_DIR}/etc"
RUN_DIR="${STATE_DIR}/run"
LOG_DIR="${STATE_DIR}/log"
SPOOL_DIR="${STATE_DIR}/spool"
DEV_DIR="${STATE_DIR}/dev"
CONF="${ETC_DIR}/slurm.conf"
NODES_FILE="${RUN_DIR}/nodes"
HOST_NAME="$(hostname -s)"
MAX_NODES=8

export SLURM_CONF="${CONF}"

# shellcheck source=tests/slurm/lib.sh
source "${HERE}/lib.sh"
# shellcheck source=tests/slurm/netns.sh
source "${HERE}/netns.sh"

NODES=()

# set_nodes <count>: the node names of a cluster of that size.
set_nodes() {
    local count="$1" i
    NODES=()
    if ((count == 1)); then
        NODES=("${HOST_NAME}")
        return
    fi
    for ((i = 1; i <= count; i++)); do
        NODES+=("node${i}")
    done
}

# The node count of the cluster recorded in the state directory (1 when none is).
recorded_count() {
    local count=1
    [[ -f ${NODES_FILE} ]] && count="$(<"${NODES_FILE}")"
    printf '%s\n' "${count}"
}

multi() { ((${#NODES[@]} > 1)); }

# ---------------------------------------------------------------------------------------------
# Health checks
# ---------------------------------------------------------------------------------------------

slurmctld_ok() {
    [[ -f ${CONF} ]] || return 1
    timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'
}

node_state() {
    [[ -f ${CONF} ]] || return 1
    timeout 10 sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -n1
}

# The node can run jobs (idle, or busy with jobs but not down/drained).
node_ok() {
    local state
    state="$(node_state "$1")" || return 1
    [[ ${state} =~ ^(idle|mixed|allocated|completing)$ ]]
}

slurmd_alive() {
    harness_pid "slurmd-$1" >/dev/null && return 0
    # A single-node slurmd started by someone else (or an older harness) also serves.
    ! multi && is_running slurmd
}

slurmd_ok() { slurmd_alive "$1" && node_ok "$1"; }

cluster_ok() {
    local node
    munge_ok && slurmctld_ok || return 1
    for node in "${NODES[@]}"; do
        slurmd_ok "${node}" || return 1
    done
}

# Any daemon recorded by this harness still alive.
harness_running() {
    local key
    while read -r key; do
        harness_pid "${key}" >/dev/null && return 0
    done < <(harness_keys)
    return 1
}

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

CONFIG_CHANGED=0
GENERATED="# Generated by tests/slurm/cluster.sh -- do not edit."

write_file_if_changed() {
    local path="$1" content="$2"
    if [[ ! -f ${path} || "$(<"${path}")" != "${content}" ]]; then
        printf '%s\n' "${content}" >"${path}.tmp"
        mv -f "${path}.tmp" "${path}"
        CONFIG_CHANGED=1
    fi
}

# Every node advertises NODE_CPUS CPUs and 8 GPUs (config_overrides): enough for the
# headers of training.sh and slurm/*.sbatch (--cpus-per-task=32, --gres=gpu:8) as written.
NODE_CPUS=32

node_lines() {
    local i=0 node addr
    for node in "${NODES[@]}"; do
        i=$((i + 1))
        if multi; then addr="$(node_addr "${i}")"; else addr=127.0.0.1; fi
        printf 'NodeName=%s NodeAddr=%s CPUs=%s RealMemory=16000 Gres=gpu:8 State=UNKNOWN\n' \
            "${node}" "${addr}" "${NODE_CPUS}"
    done
}

# Fake GPUs: slurmd insists on character devices, and stat() follows symlinks.
make_fake_gpus() {
    local i
    mkdir -p "${DEV_DIR}"
    for i in 0 1 2 3 4 5 6 7; do
        if [[ ! -L ${DEV_DIR}/nvidia${i} ]]; then
            rm -f "${DEV_DIR}/nvidia${i}"
            ln -s /dev/null "${DEV_DIR}/nvidia${i}"
        fi
    done
}

write_config() {
    mkdir -p "${ETC_DIR}" "${RUN_DIR}" "${LOG_DIR}" "${SPOOL_DIR}/ctld-${#NODES[@]}"
    make_fake_gpus
    write_file_if_changed "${CONF}" "$(slurm_conf)"
    write_file_if_changed "${ETC_DIR}/gres.conf" "${GENERATED}
AutoDetect=off
Name=gpu File=${DEV_DIR}/nvidia[0-7]"
}

# slurm.conf for the cluster of NODES.
slurm_conf() {
    local count="${#NODES[@]}" ctl=localhost slurmd_timeout=300
    if multi; then
        ctl="${HOST_NAME}(${CTL_ADDR})"
        slurmd_timeout="${SLURM_TEST_SLURMD_TIMEOUT:-20}"
    fi
    printf '%s\n' "${GENERATED}
ClusterName=maxentgrpo-test
SlurmctldHost=${ctl}
SlurmUser=root
AuthType=auth/munge
# cred_expire is also the delay before a requeued job may start again.
AuthInfo=cred_expire=5
# One state directory per node count: job records never name nodes of another layout.
StateSaveLocation=${SPOOL_DIR}/ctld-${count}
# %n: the namespaced nodes share this filesystem, so every slurmd needs its own paths.
SlurmdSpoolDir=${SPOOL_DIR}/d/%n
SlurmctldPidFile=${RUN_DIR}/slurmctld.pid
SlurmdPidFile=${RUN_DIR}/slurmd-%n.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# A node silent this long is marked down (its jobs fail as NODE_FAIL and requeue).
SlurmdTimeout=${slurmd_timeout}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=batch_sched_delay=0,sched_interval=1,sched_min_interval=0,bf_interval=1
DependencyParameters=kill_invalid_depend
JobRequeue=1
ReturnToService=2
MinJobAge=3600
KillWait=5
MailProg=/bin/true
GresTypes=gpu
# The nodes advertise more CPUs/GPUs than the machine has.
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
# Preemption by partition: a job in 'high' requeues 'debug' jobs (SIGTERM, GraceTime, kill).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$(node_lines)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
}

# ---------------------------------------------------------------------------------------------
# Daemons
# ---------------------------------------------------------------------------------------------

start_slurmctld() {
    if slurmctld_ok; then
        return 0
    fi
    if ! is_running slurmctld; then
        rm -f "${RUN_DIR}/slurmctld.pid"
        as_root env SLURM_CONF="${CONF}" slurmctld -f "${CONF}" \
            </dev/null >>"${LOG_DIR}/slurmctld.stdout" 2>&1 || {
            dump_log "${LOG_DIR}/slurmctld.stdout"
            dump_log "${LOG_DIR}/slurmctld.log"
            die "slurmctld failed to start"
        }
        record_started slurmctld "${RUN_DIR}/slurmctld.pid" || {
            dump_log "${LOG_DIR}/slurmctld.log"
            die "slurmctld exited right after starting"
        }
    fi
    wait_until 30 slurmctld_ok || {
        dump_log "${LOG_DIR}/slurmctld.log"
        die "slurmctld does not answer 'scontrol ping'"
    }
}

# start_slurmd <node>: on this host, or inside the node's namespaces (net + UTS).
start_slurmd() {
    local node="$1"
    slurmd_alive "${node}" && return 0
    rm -f "${RUN_DIR}/slurmd-${node}.pid"
    mkdir -p "${SPOOL_DIR}/d/${node}"
    local -a cmd=(env SLURM_CONF="${CONF}" slurmd -f "${CONF}" -N "${node}")
    if multi; then
        cmd=(node_exec "${node}" "${cmd[@]}")
    else
        cmd=(as_root "${cmd[@]}")
    fi
    "${cmd[@]}" </dev/null >>"${LOG_DIR}/slurmd-${node}.stdout" 2>&1 || {
        dump_log "${LOG_DIR}/slurmd-${node}.stdout"
        dump_log "${LOG_DIR}/slurmd-${node}.log"
        die "slurmd of ${node} failed to start"
    }
    record_started "slurmd-${node}" "${RUN_DIR}/slurmd-${node}.pid" || {
        dump_log "${LOG_DIR}/slurmd-${node}.log"
        die "slurmd of ${node} exited right after starting"
    }
}

wait_nodes_ready() {
    local deadline node state
    local -A resumed=()
    deadline=$(($(now) + START_TIMEOUT))
    for node in "${NODES[@]}"; do
        while true; do
            state="$(node_state "${node}" || true)"
            [[ ${state} =~ ^(idle|mixed|allocated|completing)$ ]] && break
            # A node left drained/down by an earlier run: ask once for it to come back.
            if [[ -z ${resumed[${node}]:-} && ${state} =~ (drain|down|fail) ]]; then
                log "node ${node} is '${state}'; resuming it"
                timeout 10 scontrol update NodeName="${node}" State=RESUME >&2 || true
                resumed[${node}]=1
            fi
            if (($(now) >= deadline)); then
                dump_log "${LOG_DIR}/slurmd-${node}.log"
                dump_log "${LOG_DIR}/slurmctld.log"
                timeout 10 sinfo -N -l >&2 || true
                die "node ${node} not idle after ${START_TIMEOUT} s (state '${state}')"
            fi
            sleep 0.5
        done
    done
}

START_IN_PROGRESS=0

on_exit() {
    local rc=$?
    remove_policy_rc_d
    if ((START_IN_PROGRESS && rc != 0)); then
        START_IN_PROGRESS=0
        log "start failed; removing what was started"
        (cmd_stop) || log "cleanup after the failed start failed too"
    fi
}

cmd_start() {
    local count="$1" t0 node
    t0="$(now)"
    set_nodes "${count}"
    if harness_running && [[ "$(recorded_count)" != "${count}" ]]; then
        log "a $(recorded_count)-node cluster is running; stopping it for ${count} node(s)"
        cmd_stop
    elif ! harness_running && [[ -f ${NET_LIST} ]]; then
        log "removing what is left of an earlier cluster"
        cmd_stop
    fi
    install_packages
    write_config
    if ((CONFIG_CHANGED)) && harness_running; then
        log "configuration changed; restarting the cluster"
        cmd_stop
    fi
    if cluster_ok; then
        log "cluster already running and healthy: ${NODES[*]} (SLURM_CONF=${CONF})"
        return 0
    fi
    START_IN_PROGRESS=1
    mkdir -p "${RUN_DIR}"
    printf '%s\n' "${count}" >"${NODES_FILE}"
    start_munged
    if multi; then
        net_up "${HOST_NAME}" "${NODES[@]}"
    fi
    start_slurmctld
    for node in "${NODES[@]}"; do
        start_slurmd "${node}"
    done
    wait_nodes_ready
    START_IN_PROGRESS=0
    local states
    states="$(timeout 10 sinfo -h -N -p debug -o '%N=%T' | tr '\n' ' ')"
    log "cluster ready in $(($(now) - t0)) s: ${count} node(s) ${states}SLURM_CONF=${CONF}"
}

cancel_all_jobs() {
    harness_pid slurmctld >/dev/null && slurmctld_ok || return 0
    local -a jobs=()
    mapfile -t jobs < <(timeout 10 squeue -h -o '%A' 2>/dev/null || true)
    if ((${#jobs[@]})); then
        log "cancelling jobs: ${jobs[*]}"
        timeout 10 scancel --quiet "${jobs[@]}" 2>/dev/null || true
        wait_until 15 no_process slurmstepd || true
    fi
}

cmd_stop() {
    local key
    if [[ -z "$(harness_keys)" && ! -f ${NET_LIST} ]]; then
        log "nothing to stop (no daemons started by this harness in ${STATE_DIR})"
        return 0
    fi
    # Cancel jobs first so that no slurmstepd outlives the cluster we are tearing down.
    cancel_all_jobs
    while read -r key; do
        [[ ${key} == slurmd* ]] && stop_daemon "${key}"
    done < <(harness_keys)
    stop_daemon slurmctld
    stop_daemon munged
    # Also kills what is left in the namespaces (job processes of a node whose slurmd died).
    net_down
    rm -f "${NODES_FILE}"
}

cmd_status() {
    local unhealthy=0 key pid node up
    set_nodes "$(recorded_count)"
    for key in munged slurmctld "${NODES[@]/#/slurmd-}"; do
        up=down
        case "${key}" in
        munged) munge_ok && up=up ;;
        slurmctld) slurmctld_ok && up=up ;;
        slurmd-*) slurmd_ok "${key#slurmd-}" && up=up ;;
        esac
        [[ ${up} == up ]] || unhealthy=1
        pid="$(harness_pid "${key}" || true)"
        printf '%-16s %-5s %s\n' "${key}" "${up}" "${pid:+(started by this harness, pid ${pid})}"
    done
    printf 'SLURM_CONF=%s\n' "${CONF}"
    if slurmctld_ok; then
        timeout 10 sinfo || true
    else
        printf 'sinfo: slurmctld not reachable\n'
    fi
    return "${unhealthy}"
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "${CONF}"
    printf 'export SLURM_TEST_DIR=%q\n' "${STATE_DIR}"
    printf 'export SLURM_TEST_NODES=%q\n' "$(recorded_count)"
}

# check_node <node>: a node of the running multi-node cluster.
check_node() {
    set_nodes "$(recorded_count)"
    multi || die "kill-node/cut-node/restore-node/node-pids need a multi-node cluster (start --nodes N)"
    [[ " ${NODES[*]} " == *" $1 "* ]] || die "unknown node '$1' (nodes: ${NODES[*]})"
}

cmd_kill_node() {
    check_node "$1"
    log "killing every process of $1"
    kill_netns_processes "$(netns_of "$1")" KILL
    wait_until 10 netns_empty "$(netns_of "$1")" || die "processes of $1 survived SIGKILL"
    rm -f "$(harness_pid_file "slurmd-$1")"
}

# node_link <node>: the host end of the node's veth pair (net_up_node names it by index).
node_link() { printf 'mgsh%s\n' "${1#node}"; }

# The host end down takes the carrier off both ends: no packet in or out, no RST, no FIN, so
# peers' TCP connections stay open and block, as when a node loses power or its switch port.
cmd_cut_node() {
    check_node "$1"
    log "cutting the network of $1 ($(node_link "$1") down); its processes keep running"
    as_root ip link set "$(node_link "$1")" down
}

cmd_restore_node() {
    check_node "$1"
    log "restoring the network of $1 ($(node_link "$1") up)"
    as_root ip link set "$(node_link "$1")" up
}

cmd_node_pids() {
    check_node "$1"
    as_root ip netns pids "$(netns_of "$1")"
}

usage() {
    printf 'usage: %s {start [--nodes N]|stop|status|env|kill-node NODE|cut-node NODE|restore-node NODE|node-pids NODE}\n' \
        "$0" >&2
    exit 2
}

main() {
    [[ $# -ge 1 ]] || usage
    local command="$1" count=1
    shift
    case "${command}" in
    start)
        case "$*" in
        "") ;;
        --nodes=*) count="${1#--nodes=}" ;;
        "--nodes "*) [[ $# -eq 2 ]] && count="$2" || usage ;;
        *) usage ;;
        esac
        [[ ${count} =~ ^[1-9][0-9]*$ ]] && ((count <= MAX_NODES)) ||
            die "--nodes: '${count}'; must be 1 to ${MAX_NODES}"
        trap on_exit EXIT
        cmd_start "${count}"
        ;;
    stop | status | env) [[ $# -eq 0 ]] || usage ;;&
    stop) cmd_stop ;;
    status) cmd_status || exit 3 ;;
    env) cmd_env ;;
    kill-node | cut-node | restore-node | node-pids) [[ $# -eq 1 ]] || usage ;;&
    kill-node) cmd_kill_node "$1" ;;
    cut-node) cmd_cut_node "$1" ;;
    restore-node) cmd_restore_node "$1" ;;
    node-pids) cmd_node_pids "$1" ;;
    *) usage ;;
    esac
}

main "$@"
