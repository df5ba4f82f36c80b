# Network of the multi-node test cluster; sourced by tests/slurm/cluster.sh (not run directly).
#
# Each node is a network namespace "mgs-<node>" with its own veth link to one bridge on the
# host. The host side of the bridge holds the controller address ${SUBNET}.1; node i has
# ${SUBNET}.(10+i). Nodes reach each other over the bridge (layer 2): no routing, no forwarding,
# no NAT, and nothing outside this /24 is touched. ${HOSTS_FILE}, bind-mounted over /etc/hosts in
# each node's own mount namespace (see node_exec), lets the nodes resolve each other's names, as
# on a real cluster; the host's /etc is never changed.
#
# Everything created is written to ${NET_LIST} first, so `net_down` removes exactly that, also
# after a start that failed half-way.
#
# Needs from cluster.sh: as_root, log, die, now, wait_until, RUN_DIR, ETC_DIR.

# shellcheck shell=bash

SUBNET="${SLURM_TEST_SUBNET:-10.213.7}"
BRIDGE="${SLURM_TEST_BRIDGE:-mgsbr0}"
CTL_ADDR="${SUBNET}.1"
NET_LIST="${RUN_DIR}/net.list"
HOSTS_FILE="${ETC_DIR}/hosts"

node_addr() { printf '%s.%s\n' "${SUBNET}" "$((10 + $1))"; }
netns_of() { printf 'mgs-%s\n' "$1"; }

net_record() { printf '%s %s\n' "$1" "$2" >>"${NET_LIST}"; }

link_exists() { ip link show "$1" >/dev/null 2>&1; }
netns_exists() { ip netns list 2>/dev/null | grep -qw -- "$1"; }

# Refuse to start when anything but our bridge already uses the test /24.
net_check_free() {
    local used
    used="$(ip -o -4 addr show 2>/dev/null | awk -v br="${BRIDGE}" -v net="${SUBNET}." \
        '$2 != br && index($4, net) == 1 {print $2 " " $4}')"
    [[ -z ${used} ]] || die "${SUBNET}.0/24 is already used here (${used}); set SLURM_TEST_SUBNET"
    used="$(ip -4 route show "${SUBNET}.0/24" 2>/dev/null | grep -v "dev ${BRIDGE}" || true)"
    [[ -z ${used} ]] || die "a route for ${SUBNET}.0/24 exists (${used}); set SLURM_TEST_SUBNET"
}

net_up_bridge() {
    if ! link_exists "${BRIDGE}"; then
        net_check_free
        net_record bridge "${BRIDGE}"
        as_root ip link add "${BRIDGE}" type bridge
        as_root ip addr add "${CTL_ADDR}/24" dev "${BRIDGE}"
    fi
    as_root ip link set "${BRIDGE}" up
}

# net_up_node <index> <node>: namespace, veth pair on the bridge, addresses, hosts file.
net_up_node() {
    local i="$1" node="$2" ns host_end ns_end addr
    ns="$(netns_of "${node}")"
    host_end="mgsh${i}"
    ns_end="mgsn${i}"
    addr="$(node_addr "${i}")"
    if ! netns_exists "${ns}"; then
        net_record netns "${ns}"
        as_root ip netns add "${ns}"
    fi
    if ! link_exists "${host_end}"; then
        net_record link "${host_end}"
        as_root ip link add "${host_end}" type veth peer name "${ns_end}"
        as_root ip link set "${ns_end}" netns "${ns}"
        as_root ip -n "${ns}" addr add "${addr}/24" dev "${ns_end}"
    fi
    as_root ip link set "${host_end}" master "${BRIDGE}"
    as_root ip link set "${host_end}" up
    as_root ip -n "${ns}" link set "${ns_end}" up
    as_root ip -n "${ns}" link set lo up
}

# write_hosts <host-name> <node...>: the /etc/hosts every node sees.
write_hosts() {
    local host="$1" i=0 node
    shift
    {
        printf '127.0.0.1 localhost\n%s %s\n' "${CTL_ADDR}" "${host}"
        for node in "$@"; do
            i=$((i + 1))
            printf '%s %s\n' "$(node_addr "${i}")" "${node}"
        done
    } >"${HOSTS_FILE}"
}

# node_exec <node> <cmd...>: run <cmd> on <node>: in its network namespace, with its hostname
# (UTS namespace) and its /etc/hosts (mount namespace; host mounts still propagate in). Not
# `ip netns exec`: it remounts /sys, which hides the cgroup mounts slurmd needs.
node_exec() {
    local node="$1"
    shift
    # shellcheck disable=SC2016
    as_root nsenter --net="/run/netns/$(netns_of "${node}")" \
        unshare --uts --mount --propagation slave \
        sh -c 'mount --bind "$2" /etc/hosts && hostname "$1" && shift 2 && exec "$@"' \
        sh "${node}" "${HOSTS_FILE}" "$@"
}

# net_up <host-name> <node...>
net_up() {
    local host="$1" i=0 node
    shift
    command -v ip >/dev/null || die "the multi-node cluster needs iproute2 ('ip')"
    command -v nsenter >/dev/null && command -v unshare >/dev/null ||
        die "the multi-node cluster needs util-linux ('nsenter', 'unshare')"
    mkdir -p "${RUN_DIR}"
    net_up_bridge
    for node in "$@"; do
        i=$((i + 1))
        net_up_node "${i}" "${node}"
    done
    write_hosts "${host}" "$@"
    log "network: bridge ${BRIDGE} ${CTL_ADDR}/24, nodes ${SUBNET}.11-$((10 + i))"
}

# kill_netns_processes <ns> <signal>: signal every process whose network namespace is <ns>
# (slurmd, slurmstepd and job processes of that node: all ours, since we made the namespace).
kill_netns_processes() {
    local ns="$1" sig="$2" pids
    pids="$(as_root ip netns pids "${ns}" 2>/dev/null | tr '\n' ' ')"
    [[ -n ${pids// /} ]] || return 0
    # shellcheck disable=SC2086
    as_root kill "-${sig}" ${pids} 2>/dev/null || true
}

netns_empty() { [[ -z "$(as_root ip netns pids "$1" 2>/dev/null)" ]]; }

# net_down: remove what net.list names, newest first; bounded waits.
net_down() {
    [[ -f ${NET_LIST} ]] || return 0
    local kind name
    while read -r kind name; do
        case "${kind}" in
        link) link_exists "${name}" && as_root ip link del "${name}" ;;
        netns)
            if netns_exists "${name}"; then
                kill_netns_processes "${name}" TERM
                wait_until 10 netns_empty "${name}" || kill_netns_processes "${name}" KILL
                wait_until 5 netns_empty "${name}" || log "processes left in ${name}"
                as_root ip netns del "${name}"
            fi
            ;;
        bridge) link_exists "${name}" && as_root ip link del "${name}" ;;
        esac
    done < <(tac "${NET_LIST}")
    # Namespace teardown is asynchronous in the kernel: wait until the links are really gone.
    wait_until 10 net_gone || die "still present after 10 s: $(net_left | tr '\n' ' ')"
    rm -f "${NET_LIST}"
    log "network removed"
}

# net_left: the objects of net.list that still exist.
net_left() {
    local kind name
    while read -r kind name; do
        case "${kind}" in
        link | bridge) link_exists "${name}" && printf '%s %s\n' "${kind}" "${name}" ;;
        netns) netns_exists "${name}" && printf '%s %s\n' "${kind}" "${name}" ;;
        esac
    done <"${NET_LIST}"
    return 0
}

net_gone() { [[ -z "$(net_left)" ]]; }
