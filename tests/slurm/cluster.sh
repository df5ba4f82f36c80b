#!/usr/bin/env bash
# Single-node Slurm test cluster for the maxent-grpo test suite and CI.
#
#   tests/slurm/cluster.sh start    install (Debian slurm-wlm 22.05) if needed, configure, start, wait
#   tests/slurm/cluster.sh stop     stop only the daemons this harness started
#   tests/slurm/cluster.sh status   daemon liveness + sinfo (exit 0 healthy, 3 otherwise)
#   tests/slurm/cluster.sh env      print `export SLURM_CONF=...` for `eval "$(... env)"`
#
# All configuration, spool, logs and pid files live in the state directory
# ${SLURM_TEST_DIR:-/tmp/maxent-grpo-slurm}; /etc/slurm is never touched. Munge uses the system
# defaults (/etc/munge/munge.key, /run/munge) so every Slurm binary finds it without extra config.
# Daemons started by this harness are recorded in $STATE_DIR/run/harness-<daemon>.pid; `stop`
# only ever signals those pids (after checking the process name), never a daemon started by
# someone else.
#
# Needs root, or passwordless sudo (CI runners), for apt-get and the daemons.
#
# Environment:
#   SLURM_TEST_DIR            state directory (default /tmp/maxent-grpo-slurm)
#   SLURM_TEST_START_TIMEOUT  seconds to wait for the node to become idle (default 60)
#   SLURM_TEST_STOP_TIMEOUT   seconds to wait for each daemon to exit on stop (default 30)
set -euo pipefail

export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"

STATE_DIR="${SLURM_TEST_DIR:-/tmp/maxent-grpo-slurm}"
START_TIMEOUT="${SLURM_TEST_START_TIMEOUT:-60}"
STOP_TIMEOUT="${SLURM_TEST_STOP_TIMEOUT:-30}"
ETC_DIR="${STATE_DIR}/etc"
RUN_DIR="${STATE_DIR}/run"
LOG_DIR="${STATE_DIR}/log"
SPOOL_DIR="${STATE_DIR}/spool"
DEV_DIR="${STATE_DIR}/dev"
CONF="${ETC_DIR}/slurm.conf"
NODE_NAME="$(hostname -s)"
MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN_DIR=/run/munge
MUNGE_PID_FILE="${MUNGE_RUN_DIR}/munged.pid"
DAEMONS=(munged slurmctld slurmd)

export SLURM_CONF="${CONF}"

log() { printf '[slurm-harness] %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# Run a command as root: directly when we are root, else through passwordless sudo.
as_root() {
    if [[ ${EUID} -eq 0 ]]; then
        "$@"
    else
        sudo -n --preserve-env=SLURM_CONF "$@"
    fi
}

now() { date +%s; }

# ---------------------------------------------------------------------------------------------
# Process helpers (plain /proc, no procps dependency)
# ---------------------------------------------------------------------------------------------

# pid_is <pid> <comm>: true when <pid> is alive (not a zombie) and its command name is <comm>.
pid_is() {
    local pid="$1" comm="$2" actual stat
    [[ ${pid} =~ ^[0-9]+$ ]] || return 1
    actual="$(cat "/proc/${pid}/comm" 2>/dev/null)" || return 1
    [[ ${actual} == "${comm}" ]] || return 1
    stat="$(cat "/proc/${pid}/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ ${stat:0:1} != Z ]]
}

# pids_named <comm>: print the pids of all live processes whose command name is <comm>.
pids_named() {
    local comm="$1" f pid
    for f in /proc/[0-9]*/comm; do
        pid="${f#/proc/}"
        pid="${pid%/comm}"
        if [[ "$(cat "${f}" 2>/dev/null || true)" == "${comm}" ]] && pid_is "${pid}" "${comm}"; then
            printf '%s\n' "${pid}"
        fi
    done
}

is_running() { [[ -n "$(pids_named "$1")" ]]; }

no_process() { ! is_running "$1"; }

pid_gone() { ! pid_is "$1" "$2"; }

harness_pid_file() { printf '%s/harness-%s.pid\n' "${RUN_DIR}" "$1"; }

# harness_pid <daemon>: print the pid this harness recorded for <daemon> if still alive.
harness_pid() {
    local file pid
    file="$(harness_pid_file "$1")"
    [[ -f ${file} ]] || return 1
    pid="$(<"${file}")"
    pid_is "${pid}" "$1" || return 1
    printf '%s\n' "${pid}"
}

# wait_until <timeout_s> <cmd...>: poll <cmd> every 0.5 s until it succeeds or time runs out.
wait_until() {
    local timeout="$1" deadline
    shift
    deadline=$(($(now) + timeout))
    until "$@"; do
        (($(now) < deadline)) || return 1
        sleep 0.5
    done
}

# ---------------------------------------------------------------------------------------------
# Health checks
# ---------------------------------------------------------------------------------------------

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

slurmctld_ok() {
    [[ -f ${CONF} ]] || return 1
    timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'
}

node_state() {
    [[ -f ${CONF} ]] || return 1
    timeout 10 sinfo -h -N -n "${NODE_NAME}" -o '%T' 2>/dev/null | head -n1
}

# The node can run jobs (idle, or busy with jobs but not down/drained).
node_ok() {
    local state
    state="$(node_state)" || return 1
    [[ ${state} =~ ^(idle|mixed|allocated|completing)$ ]]
}

slurmd_ok() { is_running slurmd && node_ok; }

cluster_ok() { munge_ok && slurmctld_ok && slurmd_ok; }

# ---------------------------------------------------------------------------------------------
# Installation
# ---------------------------------------------------------------------------------------------

POLICY_RC_D=/usr/sbin/policy-rc.d
CREATED_POLICY_RC_D=0

# Remove the policy-rc.d that blocks service start-up during apt-get, only if we created it.
remove_policy_rc_d() {
    if ((CREATED_POLICY_RC_D)); then
        as_root rm -f "${POLICY_RC_D}" || true
        CREATED_POLICY_RC_D=0
    fi
}

install_packages() {
    if command -v sbatch >/dev/null && command -v slurmctld >/dev/null &&
        command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null || die "slurm is not installed and apt-get is unavailable"
    local t0 rc=0
    t0="$(now)"
    log "installing slurmctld slurmd slurm-client munge (apt-get)"
    # Keep the packages' init scripts from starting system daemons with /etc/slurm config.
    if [[ ! -e ${POLICY_RC_D} ]]; then
        trap remove_policy_rc_d EXIT
        CREATED_POLICY_RC_D=1
        printf '#!/bin/sh\nexit 101\n' | as_root tee "${POLICY_RC_D}" >/dev/null
        as_root chmod 0755 "${POLICY_RC_D}"
    fi
    local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends
        slurmctld slurmd slurm-client munge)
    # apt output goes to stderr so that stdout stays machine-readable.
    if ! as_root "${apt[@]}" >&2; then
        log "apt-get install failed; running apt-get update and retrying"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update >&2 || rc=$?
        if ((rc == 0)); then
            as_root "${apt[@]}" >&2 || rc=$?
        fi
    fi
    remove_policy_rc_d
    trap - EXIT
    ((rc == 0)) || die "apt-get failed (exit ${rc})"
    log "installed in $(($(now) - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

write_file_if_changed() {
    local path="$1" content="$2"
    if [[ ! -f ${path} || "$(<"${path}")" != "${content}" ]]; then
        printf '%s\n' "${content}" >"${path}.tmp"
        mv -f "${path}.tmp" "${path}"
    fi
}

write_config() {
    mkdir -p "${ETC_DIR}" "${RUN_DIR}" "${LOG_DIR}" "${SPOOL_DIR}/ctld" "${SPOOL_DIR}/d" "${DEV_DIR}"
    # Fake GPUs: slurmd insists on character devices, and stat() follows symlinks.
    local i
    for i in 0 1 2 3 4 5 6 7; do
        if [[ ! -L ${DEV_DIR}/nvidia${i} ]]; then
            rm -f "${DEV_DIR}/nvidia${i}"
            ln -s /dev/null "${DEV_DIR}/nvidia${i}"
        fi
    done
    write_file_if_changed "${CONF}" "# Generated by tests/slurm/cluster.sh -- do not edit.
ClusterName=maxentgrpo-test
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
# cred_expire is also the delay before a requeued job may start again.
AuthInfo=cred_expire=5
StateSaveLocation=${SPOOL_DIR}/ctld
SlurmdSpoolDir=${SPOOL_DIR}/d
SlurmctldPidFile=${RUN_DIR}/slurmctld.pid
SlurmdPidFile=${RUN_DIR}/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
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
# The node advertises more CPUs/GPUs than the machine has.
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
NodeName=${NODE_NAME} NodeAddr=127.0.0.1 CPUs=8 RealMemory=16000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=${NODE_NAME} Default=YES MaxTime=INFINITE State=UP"
    write_file_if_changed "${ETC_DIR}/gres.conf" "# Generated by tests/slurm/cluster.sh -- do not edit.
AutoDetect=off
Name=gpu File=${DEV_DIR}/nvidia[0-7]"
}

# ---------------------------------------------------------------------------------------------
# Daemons
# ---------------------------------------------------------------------------------------------

prepare_munge() {
    id munge >/dev/null 2>&1 || die "user 'munge' does not exist (is the munge package installed?)"
    as_root install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    as_root install -d -o munge -g munge -m 0755 "${MUNGE_RUN_DIR}"
    if ! as_root test -s "${MUNGE_KEY}"; then
        log "creating munge key ${MUNGE_KEY}"
        if command -v mungekey >/dev/null; then
            as_root mungekey --create --keyfile="${MUNGE_KEY}"
        else
            as_root dd if=/dev/urandom of="${MUNGE_KEY}" bs=1024 count=1 status=none
        fi
    fi
    as_root chown munge:munge "${MUNGE_KEY}"
    as_root chmod 0400 "${MUNGE_KEY}"
}

# record_started <daemon> <pidfile-written-by-daemon>: remember that this harness started it.
record_started() {
    local daemon="$1" daemon_pid_file="$2" pid=""
    if wait_until 15 as_root test -s "${daemon_pid_file}"; then
        pid="$(as_root cat "${daemon_pid_file}")"
    fi
    if ! pid_is "${pid}" "${daemon}"; then
        # Fall back to the newest process of that name.
        pid="$(pids_named "${daemon}" | sort -n | tail -n1)"
    fi
    [[ -n ${pid} ]] || return 1
    printf '%s\n' "${pid}" >"$(harness_pid_file "${daemon}")"
    log "started ${daemon} (pid ${pid})"
}

dump_log() {
    local file="$1"
    if [[ -f ${file} ]]; then
        log "---- last lines of ${file} ----"
        tail -n 25 "${file}" >&2 || true
    fi
}

start_munged() {
    if munge_ok; then
        return 0
    fi
    if is_running munged; then
        log "munged is running but 'munge -n | unmunge' fails; waiting for it"
        wait_until 10 munge_ok && return 0
        die "munged (not started by this harness) is running but unhealthy"
    fi
    prepare_munge
    local out="${LOG_DIR}/munged.stdout"
    if [[ ${EUID} -eq 0 ]]; then
        runuser -u munge -- munged </dev/null >>"${out}" 2>&1 || {
            dump_log "${out}"
            dump_log /var/log/munge/munged.log
            die "munged failed to start"
        }
    else
        # The log file belongs to the invoking user; the redirect is meant to happen outside sudo.
        # shellcheck disable=SC2024
        sudo -n -u munge munged </dev/null >>"${out}" 2>&1 || {
            dump_log "${out}"
            die "munged failed to start"
        }
    fi
    record_started munged "${MUNGE_PID_FILE}" || die "munged started but its pid is unknown"
    wait_until 10 munge_ok || {
        dump_log /var/log/munge/munged.log
        die "munged does not answer"
    }
}

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

start_slurmd() {
    if is_running slurmd; then
        return 0
    fi
    rm -f "${RUN_DIR}/slurmd.pid"
    as_root env SLURM_CONF="${CONF}" slurmd -f "${CONF}" -N "${NODE_NAME}" \
        </dev/null >>"${LOG_DIR}/slurmd.stdout" 2>&1 || {
        dump_log "${LOG_DIR}/slurmd.stdout"
        dump_log "${LOG_DIR}/slurmd.log"
        die "slurmd failed to start"
    }
    record_started slurmd "${RUN_DIR}/slurmd.pid" || {
        dump_log "${LOG_DIR}/slurmd.log"
        die "slurmd exited right after starting"
    }
}

wait_node_ready() {
    local deadline state resumed=0
    deadline=$(($(now) + START_TIMEOUT))
    while true; do
        state="$(node_state || true)"
        if [[ ${state} =~ ^(idle|mixed|allocated|completing)$ ]]; then
            return 0
        fi
        # A node left drained/down by an earlier run: ask once for it to come back.
        if ((!resumed)) && [[ ${state} =~ (drain|down|fail) ]]; then
            log "node ${NODE_NAME} is '${state}'; resuming it"
            timeout 10 scontrol update NodeName="${NODE_NAME}" State=RESUME >&2 || true
            resumed=1
        fi
        if (($(now) >= deadline)); then
            dump_log "${LOG_DIR}/slurmd.log"
            dump_log "${LOG_DIR}/slurmctld.log"
            timeout 10 sinfo -N -l >&2 || true
            die "node ${NODE_NAME} not idle after ${START_TIMEOUT} s (state '${state}')"
        fi
        sleep 0.5
    done
}

cmd_start() {
    local t0
    t0="$(now)"
    if [[ -f ${CONF} ]] && command -v sbatch >/dev/null && cluster_ok; then
        log "cluster already running and healthy (SLURM_CONF=${CONF})"
        return 0
    fi
    install_packages
    write_config
    start_munged
    start_slurmctld
    start_slurmd
    wait_node_ready
    log "cluster ready in $(($(now) - t0)) s: node ${NODE_NAME} $(node_state), SLURM_CONF=${CONF}"
}

# stop_daemon <daemon>: stop <daemon> if (and only if) this harness started it.
stop_daemon() {
    local daemon="$1" file pid t0
    file="$(harness_pid_file "${daemon}")"
    [[ -f ${file} ]] || return 0
    if ! pid="$(harness_pid "${daemon}")"; then
        rm -f "${file}"
        return 0
    fi
    t0="$(now)"
    log "stopping ${daemon} (pid ${pid})"
    as_root kill -TERM "${pid}" 2>/dev/null || true
    if ! wait_until "${STOP_TIMEOUT}" pid_gone "${pid}" "${daemon}"; then
        log "${daemon} (pid ${pid}) ignored SIGTERM for ${STOP_TIMEOUT} s; sending SIGKILL"
        as_root kill -KILL "${pid}" 2>/dev/null || true
        wait_until 10 pid_gone "${pid}" "${daemon}" || die "could not stop ${daemon} (pid ${pid})"
    fi
    rm -f "${file}"
    log "stopped ${daemon} in $(($(now) - t0)) s"
}

cmd_stop() {
    local stopped_any=0 daemon
    for daemon in "${DAEMONS[@]}"; do
        [[ -f "$(harness_pid_file "${daemon}")" ]] && stopped_any=1
    done
    if ((!stopped_any)); then
        log "nothing to stop (no daemons started by this harness in ${STATE_DIR})"
        return 0
    fi
    # Cancel jobs first so that no slurmstepd outlives the cluster we are tearing down.
    if harness_pid slurmctld >/dev/null && slurmctld_ok; then
        local -a jobs=()
        mapfile -t jobs < <(timeout 10 squeue -h -o '%A' 2>/dev/null || true)
        if ((${#jobs[@]})); then
            log "cancelling jobs: ${jobs[*]}"
            timeout 10 scancel --quiet "${jobs[@]}" 2>/dev/null || true
            wait_until 15 no_process slurmstepd || true
        fi
    fi
    for daemon in slurmd slurmctld munged; do
        stop_daemon "${daemon}"
    done
}

cmd_status() {
    local unhealthy=0 daemon pid owner
    for daemon in "${DAEMONS[@]}"; do
        if pid="$(harness_pid "${daemon}")"; then
            owner="started by this harness, pid ${pid}"
        elif is_running "${daemon}"; then
            owner="not started by this harness, pid $(pids_named "${daemon}" | tr '\n' ' ')"
        else
            owner=""
        fi
        local up=down
        case "${daemon}" in
        munged) munge_ok && up=up ;;
        slurmctld) slurmctld_ok && up=up ;;
        slurmd) slurmd_ok && up=up ;;
        esac
        [[ ${up} == up ]] || unhealthy=1
        printf '%-10s %-5s %s\n' "${daemon}" "${up}" "${owner:+(${owner})}"
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
}

usage() {
    printf 'usage: %s {start|stop|status|env}\n' "$0" >&2
    exit 2
}

main() {
    [[ $# -eq 1 ]] || usage
    case "$1" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status)
        cmd_status || exit 3
        ;;
    env) cmd_env ;;
    *) usage ;;
    esac
}

main "$@"
