# Helpers of the Slurm test harness: logging, root, processes, waits, installation, munge.
# Sourced by tests/slurm/cluster.sh (not run directly). Needs LOG_DIR and RUN_DIR.

# shellcheck shell=bash

MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN_DIR=/run/munge
MUNGE_PID_FILE="${MUNGE_RUN_DIR}/munged.pid"

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

# Daemons this harness started are recorded as $RUN_DIR/harness-<key>.pid; the key is the
# command name, or "<command>-<node>" for the slurmd of one node.
harness_pid_file() { printf '%s/harness-%s.pid\n' "${RUN_DIR}" "$1"; }
key_comm() { printf '%s\n' "${1%%-*}"; }

# harness_pid <key>: print the pid this harness recorded for <key> if still alive.
harness_pid() {
    local file pid
    file="$(harness_pid_file "$1")"
    [[ -f ${file} ]] || return 1
    pid="$(<"${file}")"
    pid_is "${pid}" "$(key_comm "$1")" || return 1
    printf '%s\n' "${pid}"
}

# harness_keys: the keys of every daemon recorded by this harness (alive or not).
harness_keys() {
    local f key
    for f in "${RUN_DIR}"/harness-*.pid; do
        [[ -e ${f} ]] || continue
        key="${f##*/harness-}"
        printf '%s\n' "${key%.pid}"
    done
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

dump_log() {
    local file="$1"
    if [[ -f ${file} ]]; then
        log "---- last lines of ${file} ----"
        tail -n 25 "${file}" >&2 || true
    fi
}

# record_started <key> <pidfile-written-by-daemon>: remember that this harness started it.
record_started() {
    local key="$1" daemon_pid_file="$2" comm pid=""
    comm="$(key_comm "${key}")"
    if wait_until 15 as_root test -s "${daemon_pid_file}"; then
        pid="$(as_root cat "${daemon_pid_file}")"
    fi
    if ! pid_is "${pid}" "${comm}" && [[ ${key} == "${comm}" ]]; then
        # Fall back to the newest process of that name (never for one node's slurmd: the
        # other nodes' slurmd have the same name).
        pid="$(pids_named "${comm}" | sort -n | tail -n1)"
    fi
    pid_is "${pid}" "${comm}" || return 1
    printf '%s\n' "${pid}" >"$(harness_pid_file "${key}")"
    log "started ${key} (pid ${pid})"
}

# stop_daemon <key>: stop the daemon recorded under <key> (only that pid, name checked).
stop_daemon() {
    local key="$1" comm file pid t0
    comm="$(key_comm "${key}")"
    file="$(harness_pid_file "${key}")"
    [[ -f ${file} ]] || return 0
    if ! pid="$(harness_pid "${key}")"; then
        rm -f "${file}"
        return 0
    fi
    t0="$(now)"
    as_root kill -TERM "${pid}" 2>/dev/null || true
    if ! wait_until "${STOP_TIMEOUT}" pid_gone "${pid}" "${comm}"; then
        log "${key} (pid ${pid}) ignored SIGTERM for ${STOP_TIMEOUT} s; sending SIGKILL"
        as_root kill -KILL "${pid}" 2>/dev/null || true
        wait_until 10 pid_gone "${pid}" "${comm}" || die "could not stop ${key} (pid ${pid})"
    fi
    rm -f "${file}"
    log "stopped ${key} (pid ${pid}) in $(($(now) - t0)) s"
}

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
    # (cluster.sh's EXIT trap removes it if we die half-way.)
    if [[ ! -e ${POLICY_RC_D} ]]; then
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
    ((rc == 0)) || die "apt-get failed (exit ${rc})"
    log "installed in $(($(now) - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# Munge (system defaults: /etc/munge/munge.key, /run/munge; a unix socket on the shared
# filesystem, so the slurmd of every namespaced node reaches the same munged)
# ---------------------------------------------------------------------------------------------

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

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
