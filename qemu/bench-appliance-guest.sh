# Runs inside the benchmark appliance VM (scripts/bench-qemu.sh boots it with qemu/run-guest.sh,
# which copies this file to /etc/edgevol-bench-appliance.sh; busybox sh). Two identical raw
# virtio-blk backing disks: serial EVBENCHPOOL holds edgevold's pool (formatted blank here) and
# serial EVBENCHNVMET is exported by the kernel's nvmet + nvmet-tcp on a second port, so both
# targets serve the same kind of backing from the same VM and CPU.
#   edgevold: CSI over mTLS on :9500 (host PKI in /etc/edgevol-pki), NVMe/TCP on :4420
#   nvmet-tcp: NQN from edgevol.nvmet_nqn, port 4421, allow_any_host
#   edgevol.busy_poll_us (optional): edgevold's nvme.busy_poll_us
#   e2e-agent: shell commands on :7001 (the host reads this VM's /proc/stat around each fio run
#              through it, as it does the node VM's); started last, idle between commands
# Markers: EDGEVOL-BENCH-APPLIANCE READY | EDGEVOL-BENCH-APPLIANCE FAILED <why>
# shellcheck shell=sh
# shellcheck source=qemu/guest-lib.sh
. /lib/edgevol/guest-lib.sh
GUEST_MARKER=EDGEVOL-BENCH-APPLIANCE
# shellcheck disable=SC2317 # run by retry
devices() { iface_of 52:54:00:ed:01:01 && disk_of EVBENCHNVMET; }
retry 50 devices
net_up 52:54:00:ed:00:01 10.0.2.15/24 || fail "management network"
net_up 52:54:00:ed:01:01 192.168.77.1/24 || fail "storage network"
pool="$(disk_of EVBENCHPOOL)" || fail "no pool disk (serial EVBENCHPOOL)"
other="$(disk_of EVBENCHNVMET)" || fail "no nvmet disk (serial EVBENCHNVMET)"
echo "edgevol-bench: pool on $pool, nvmet on $other"
# The same I/O scheduler on both disks: edgevold selects `none` for its pool (hal/src/scheduler.rs).
echo none >"/sys/block/${other#/dev/}/queue/scheduler" || fail "nvmet disk scheduler"

# --- kernel target: nvmet + nvmet-tcp through configfs ---------------------------------------
nqn="$(arg nvmet_nqn)"
[ -n "$nqn" ] || fail "edgevol.nvmet_nqn missing from the kernel command line"
mount -t configfs none /sys/kernel/config 2>/dev/null
cfg=/sys/kernel/config/nvmet
[ -d "$cfg" ] || fail "no $cfg (nvmet module not loaded?)"
mkdir "$cfg/subsystems/$nqn" || fail "nvmet subsystem"
echo 1 >"$cfg/subsystems/$nqn/attr_allow_any_host"
mkdir "$cfg/subsystems/$nqn/namespaces/1" || fail "nvmet namespace"
printf %s "$other" >"$cfg/subsystems/$nqn/namespaces/1/device_path"
echo 1 >"$cfg/subsystems/$nqn/namespaces/1/enable" || fail "nvmet namespace enable"
mkdir "$cfg/ports/2" || fail "nvmet port"
echo tcp >"$cfg/ports/2/addr_trtype"
echo ipv4 >"$cfg/ports/2/addr_adrfam"
echo 192.168.77.1 >"$cfg/ports/2/addr_traddr"
echo 4421 >"$cfg/ports/2/addr_trsvcid"
ln -s "$cfg/subsystems/$nqn" "$cfg/ports/2/subsystems/$nqn" || fail "nvmet port link"
echo "edgevol-bench: nvmet-tcp exports $other as $nqn on 192.168.77.1:4421"

# --- edgevold ---------------------------------------------------------------------------------
mkdir -p /tmp/state
busy_poll_us="$(arg busy_poll_us)"
cat >/tmp/edgevold.toml <<CFG
data_dir = "/tmp/state"
listen = "0.0.0.0:9500"
devices = ["$pool"]

[tls]
ca = "/etc/edgevol-pki/ca.pem"
cert = "/etc/edgevol-pki/server.pem"
key = "/etc/edgevol-pki/server.key"

[nvme]
listen = "0.0.0.0:4420"
advertise = "192.168.77.1"
# The node VM's 6.1 kernel has no NVMe authentication (and nvmet-tcp, the baseline, runs none).
allow_unauthenticated_hosts = true
${busy_poll_us:+busy_poll_us = $busy_poll_us}
CFG
log=/tmp/edgevold.log
: >"$log"
edgevold --config /tmp/edgevold.toml --format-blank >"$log" 2>&1 &
pid=$!
tail -n +1 -f "$log" &
ready=""
for _ in $(seq 1 1200); do
    grep -q "pool open: ready" "$log" && { ready=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
[ -n "$ready" ] || fail "edgevold did not become ready"
# Only the exec port is used here: the CSI splice it also listens for has no socket behind it.
e2e-agent --csi-port 7000 --socket /run/no-csi.sock --exec-port 7001 &
echo "EDGEVOL-BENCH-APPLIANCE READY"
wait "$pid"
fail "edgevold exited"
