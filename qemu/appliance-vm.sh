#!/usr/bin/env bash
# Boot the appliance firmware disk (image/build.sh's edgevol.img) under QEMU (TCG), BIOS boot
# through syslinux, with emulated NVMe drives, a management NIC on slirp (the host reaches CSI
# over mTLS on 127.0.0.1:--csi-port) and a storage NIC on a `-netdev dgram` link to node VMs.
# Serial console -> log file. Waits for a marker, then leaves the VM running (detached) or stops it.
#
# usage: qemu/appliance-vm.sh --disk IMG --nvme FILE [--nvme FILE...] [options]
#   --name NAME           label for the log and pidfile (default appliance)
#   --csi-port PORT       host port forwarded to the appliance's CSI port 9500 (default: none)
#   --nvme-port PORT      host port forwarded to its NVMe/TCP port 4420 (default: none)
#   --link LOCAL:REMOTE   UDP ports of the storage link (dgram on 127.0.0.1) (default: no link)
#   --wait-for TEXT       marker to wait for (default 'EDGEVOL-APPLIANCE READY')
#   --fail-marker TEXT    marker that ends the wait as a failure (default 'EDGEVOL-APPLIANCE FAILED')
#   --expect-fail         success means the fail marker appeared (then the VM is stopped)
#   --stop                stop the VM once the marker appeared (default: keep it running)
#   --timeout SECS        budget to reach the marker (default 180)
#   --lifetime SECS       hard limit of a detached VM's life, enforced by a watchdog (default 900)
#   --mem MB (default 512), --smp N (default 1), --log FILE, --pidfile FILE
# Exit: 0 as expected, 1 otherwise, 124 timeout, 2 usage. The log keeps the whole console.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${EDGEVOL_QEMU_CACHE:-$ROOT/qemu/.cache}"

name=appliance disk="" csi_port="" nvme_port="" link="" wait_for="EDGEVOL-APPLIANCE READY"
fail_marker="EDGEVOL-APPLIANCE FAILED" expect_fail=0 stop=0 timeout_s=180 lifetime=900
mem=512 smp=1 log="" pidfile=""
nvmes=()
die() { echo "appliance-vm: $*" >&2; exit 2; }
while (($#)); do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --disk) disk="$2"; shift 2 ;;
    --nvme) nvmes+=("$2"); shift 2 ;;
    --csi-port) csi_port="$2"; shift 2 ;;
    --nvme-port) nvme_port="$2"; shift 2 ;;
    --link) link="$2"; shift 2 ;;
    --wait-for) wait_for="$2"; shift 2 ;;
    --fail-marker) fail_marker="$2"; shift 2 ;;
    --expect-fail) expect_fail=1; shift ;;
    --stop) stop=1; shift ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --lifetime) lifetime="$2"; shift 2 ;;
    --mem) mem="$2"; shift 2 ;;
    --smp) smp="$2"; shift 2 ;;
    --log) log="$2"; shift 2 ;;
    --pidfile) pidfile="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ -f "$disk" ]] || die "--disk: no such file '$disk' (build it with image/build.sh)"
((${#nvmes[@]})) || die "at least one --nvme FILE"
mkdir -p "$CACHE/logs" "$CACHE/run"
log="${log:-$CACHE/logs/$name.log}"
pidfile="${pidfile:-$CACHE/run/$name.pid}"

fwd=""
[[ -n "$csi_port" ]] && fwd+=",hostfwd=tcp:127.0.0.1:$csi_port-:9500"
[[ -n "$nvme_port" ]] && fwd+=",hostfwd=tcp:127.0.0.1:$nvme_port-:4420"
args=(qemu-system-x86_64 -accel tcg -m "$mem" -smp "$smp" -nodefaults -no-reboot
    -display none -monitor none -serial "file:$log"
    -drive "file=$disk,if=none,id=boot,format=raw,cache=writeback"
    -device virtio-blk-pci,drive=boot,bootindex=0
    -netdev "user,id=mgmt,restrict=on$fwd"
    -device virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:01)
if [[ -n "$link" ]]; then
    args+=(-netdev "dgram,id=storage,local.type=inet,local.host=127.0.0.1,local.port=${link%%:*},remote.type=inet,remote.host=127.0.0.1,remote.port=${link#*:}"
        -device virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:01)
fi
i=0
for f in "${nvmes[@]}"; do
    [[ -f "$f" ]] || die "--nvme: no such file '$f'"
    args+=(-drive "file=$f,if=none,id=nvm$i,format=raw,cache=writeback"
        -device "nvme,serial=EDGEVOLNVME$i,drive=nvm$i")
    i=$((i + 1))
done

: >"$log"
echo "appliance-vm: $name: ${args[*]}" >&2
start=$(date +%s)
"${args[@]}" -daemonize -pidfile "$pidfile" || die "qemu failed to start"
pid="$(cat "$pidfile")"
# The watchdog: no VM outlives its budget, even if the caller dies without cleaning up.
setsid bash -c "sleep $lifetime; kill $pid 2>/dev/null" </dev/null >/dev/null 2>&1 &
stop_vm() { kill "$pid" 2>/dev/null || true; }

verdict=""
while :; do
    if grep -qF -- "$fail_marker" "$log"; then verdict=failmarker; break; fi
    if grep -qF -- "$wait_for" "$log"; then verdict=marker; break; fi
    if ! kill -0 "$pid" 2>/dev/null; then verdict=exited; break; fi
    if (($(date +%s) - start >= timeout_s)); then verdict=timeout; break; fi
    sleep 0.5
done
elapsed=$(($(date +%s) - start))
case "$verdict/$expect_fail" in
marker/0)
    echo "appliance-vm: $name: '$wait_for' after ${elapsed}s, pid $pid (log: $log)" >&2
    ((stop)) && stop_vm
    exit 0 ;;
failmarker/1)
    echo "appliance-vm: $name: failed as expected after ${elapsed}s: $(grep -F -- "$fail_marker" "$log" | head -1)" >&2
    stop_vm
    exit 0 ;;
timeout/*)
    stop_vm
    echo "appliance-vm: $name: TIMEOUT after ${timeout_s}s (log: $log); last lines:" >&2
    tail -n 20 "$log" >&2
    exit 124 ;;
*)
    stop_vm
    echo "appliance-vm: $name: unexpected outcome '$verdict' after ${elapsed}s (log: $log); last lines:" >&2
    tail -n 30 "$log" >&2
    exit 1 ;;
esac
