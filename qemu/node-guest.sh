# Runs inside a node VM (qemu/node-vm.sh copies it to /etc/edgevol-node-guest.sh; busybox sh).
#   sh node-guest.sh                   the VM's job: brings up the management NIC (slirp: the host
#                                      reaches the test agent) and the storage NIC (the dgram link
#                                      to the appliance), starts edgevol-node on its unix socket,
#                                      and the test-only e2e-agent that splices TCP :7000 to that
#                                      socket and runs shell commands on :7001.
#   sh node-guest.sh restart [FLAG..]  (through the agent) SIGKILLs the running edgevol-node, as a
#                                      crash or a replaced pod would end it, and starts it again
#                                      with the same flags plus FLAG..; returns once the new
#                                      process serves its socket. Prints "restarted OLD -> NEW".
# Kernel arguments (node-vm.sh): edgevol.addr, edgevol.appliance (topology; a comma-separated
# list for a node that reaches several appliances), edgevol.hostnqn (the
# host NQN to use), edgevol.enrol=HOST:PORT (enrol for DH-HMAC-CHAP keys there with
# /etc/edgevol/{ca.pem,node.pem,node.key}).
# Markers: EDGEVOL-NODE READY | EDGEVOL-NODE FAILED <why>
# shellcheck shell=sh
# shellcheck source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
GUEST_MARKER=EDGEVOL-NODE
sock=/run/csi/csi.sock pidfile=/run/edgevol-node.pid
start_node() { # extra flags...; the process's output goes to the console (the VM's log)
    topology=""
    for a in $(arg appliance | tr , ' '); do
        topology="$topology --topology edgevol.io/appliance=$a"
    done
    enrol=""
    [ -n "$(arg enrol)" ] && enrol="--appliance $(arg enrol) --appliance-ca /etc/edgevol/ca.pem \
        --node-cert /etc/edgevol/node.pem --node-key /etc/edgevol/node.key"
    # shellcheck disable=SC2086
    edgevol-node --endpoint "unix://$sock" --state-dir /var/lib/edgevol-node $topology $enrol "$@" \
        </dev/null >/dev/console 2>&1 &
    echo $! >"$pidfile"
}
inode() { stat -c %i "$sock" 2>/dev/null || echo none; }
# A socket that exists and is not the one a previous process left (its inode changed).
wait_socket() { # OLD-INODE
    for _ in $(seq 1 100); do
        [ -S "$sock" ] && [ "$(inode)" != "$1" ] && return 0
        sleep 0.2
    done
    return 1
}

if [ "${1:-}" = restart ]; then
    shift
    old=$(cat "$pidfile") || { echo "no $pidfile"; exit 1; }
    before=$(inode)
    kill -9 "$old" || { echo "edgevol-node $old was not running"; exit 1; }
    # Gone, or a zombie nobody reaps (its parent is the VM's init script).
    while [ -e "/proc/$old" ] && ! grep -q '^State:.*Z' "/proc/$old/status" 2>/dev/null; do
        sleep 0.1
    done
    start_node "$@"
    wait_socket "$before" || { echo "the new edgevol-node did not create its socket"; exit 1; }
    echo "restarted $old -> $(cat "$pidfile")"
    exit 0
fi

retry 50 iface_of 52:54:00:ed:00:02
net_up 52:54:00:ed:00:02 10.0.2.15/24 || fail "management network"
net_up 52:54:00:ed:01:02 "$(arg addr)/24" || fail "storage network"
mkdir -p /run/csi /var/lib/edgevol-node /etc/nvme /var/lib/kubelet
nqn="$(arg hostnqn)"
[ -n "$nqn" ] && echo "$nqn" >/etc/nvme/hostnqn
start_node
wait_socket none || fail "edgevol-node did not create its socket"
e2e-agent --csi-port 7000 --socket "$sock" --exec-port 7001 &
echo "EDGEVOL-NODE READY hostnqn=$(cat /etc/nvme/hostnqn 2>/dev/null)"
wait
