# Runs inside a node VM (qemu/node-vm.sh copies it to /etc/edgevol-node-guest.sh; busybox sh).
# Brings up the management NIC (slirp: the host reaches the test agent) and the storage NIC (the
# dgram link to the appliance), starts edgevol-node on its unix socket, and the test-only
# e2e-agent that splices TCP :7000 to that socket and runs shell commands on :7001.
# Markers: EDGEVOL-NODE READY | EDGEVOL-NODE FAILED <why>
arg() { sed -n "s/.*edgevol\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
fail() { echo "EDGEVOL-NODE FAILED $*"; exit 1; }
iface_of() {
    for n in /sys/class/net/*; do
        [ "$(cat "$n/address" 2>/dev/null)" = "$1" ] && { basename "$n"; return 0; }
    done
    return 1
}
for i in $(seq 1 50); do iface_of 52:54:00:ed:00:02 >/dev/null && break; sleep 0.1; done
mgmt="$(iface_of 52:54:00:ed:00:02)" || fail "no management NIC"
storage="$(iface_of 52:54:00:ed:01:02)" || fail "no storage NIC"
ip link set "$mgmt" up && ip addr add 10.0.2.15/24 dev "$mgmt" || fail "management network"
ip link set "$storage" up && ip addr add "$(arg addr)/24" dev "$storage" || fail "storage network"
mkdir -p /run/csi /var/lib/edgevol-node /etc/nvme /var/lib/kubelet
topology=""
[ -n "$(arg appliance)" ] && topology="--topology edgevol.io/appliance=$(arg appliance)"
# shellcheck disable=SC2086
edgevol-node --endpoint unix:///run/csi/csi.sock --state-dir /var/lib/edgevol-node $topology &
for i in $(seq 1 100); do [ -S /run/csi/csi.sock ] && break; sleep 0.2; done
[ -S /run/csi/csi.sock ] || fail "edgevol-node did not create its socket"
e2e-agent --csi-port 7000 --socket /run/csi/csi.sock --exec-port 7001 &
echo "EDGEVOL-NODE READY hostnqn=$(cat /etc/nvme/hostnqn 2>/dev/null)"
wait
