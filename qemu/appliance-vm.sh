#!/usr/bin/env bash
# Boot the appliance firmware disk (image/build.sh's edgevol.img) under QEMU (TCG), BIOS boot
# (SeaBIOS, syslinux) or UEFI boot (OVMF from the pinned ovmf .deb, GRUB EFI), with emulated NVMe
# drives, a management NIC on slirp (the host reaches CSI
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
#                         (it and --timeout are multiplied by EDGEVOL_TEST_TIME_SCALE)
#   --firmware bios|uefi  SeaBIOS (QEMU's default) or OVMF (default bios)
#   --watchdog i6300esb|none  the board's hardware watchdog: QEMU's i6300esb, its expiry a reset
#                         (under -no-reboot: the VM ends), or none (the image falls back to
#                         softdog) (default i6300esb)
#   --disk-write-bps N    throttle the guest's writes to the disk to N bytes/s (a slow boot
#                         medium, to cut power during a long write) (default: none)
#   --qmp-events FILE     append QEMU's QMP events (JSON lines: WATCHDOG, SHUTDOWN with its
#                         reason, ...) to FILE, to tell a watchdog reset from a guest's reboot
#   --mem MB (default 512), --smp N (default 1), --log FILE, --pidfile FILE
# Exit: 0 as expected, 1 otherwise, 124 timeout, 2 usage. The log keeps the whole console.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

name=appliance disk="" csi_port="" nvme_port="" link="" wait_for="EDGEVOL-APPLIANCE READY"
fail_marker="EDGEVOL-APPLIANCE FAILED" expect_fail=0 stop=0 timeout=180 lifetime=900
mem=512 smp=1 log="" pidfile="" firmware=bios watchdog=i6300esb qmp_events="" disk_write_bps=""
nvme=()
opts_parse 'name disk nvme+ csi-port nvme-port link wait-for fail-marker expect-fail! stop! timeout
    lifetime mem smp log pidfile firmware watchdog qmp-events disk-write-bps' "$@"
timeout=$(scaled "$timeout") lifetime=$(scaled "$lifetime")
[[ -f "$disk" ]] || die "--disk: no such file '$disk' (build it with image/build.sh)"
((${#nvme[@]})) || die "at least one --nvme FILE"
mkdir -p "$CACHE/logs" "$CACHE/run"
log="${log:-$CACHE/logs/$name.log}"
pidfile="${pidfile:-$CACHE/run/$name.pid}"

fwd=""
[[ -n "$csi_port" ]] && fwd+=",hostfwd=tcp:127.0.0.1:$csi_port-:9500"
[[ -n "$nvme_port" ]] && fwd+=",hostfwd=tcp:127.0.0.1:$nvme_port-:4420"
args=(qemu-system-x86_64 -accel tcg -m "$mem" -smp "$smp" -nodefaults -no-reboot
    -display none -monitor none -serial "file:$log"
    -drive "file=$disk,if=none,id=boot,format=raw,cache=writeback${disk_write_bps:+,throttling.bps-write=$disk_write_bps}"
    -device "virtio-blk-pci,drive=boot,bootindex=0"
    -netdev "user,id=mgmt,restrict=on$fwd"
    -device "virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:01")
case "$firmware" in
bios) ;;
uefi)
    ovmf="$CACHE/image-debs/ovmf"
    deb_unpack ovmf "$EDGEVOL_OVMF_VERSION" "$ovmf"
    # OVMF keeps its variables in a writable flash: a fresh copy per VM, no state between runs.
    cp "$ovmf/usr/share/OVMF/OVMF_VARS_4M.fd" "$CACHE/run/$name.ovmf-vars.fd"
    args+=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$ovmf/usr/share/OVMF/OVMF_CODE_4M.fd"
        -drive "if=pflash,format=raw,unit=1,file=$CACHE/run/$name.ovmf-vars.fd")
    ;;
*) die "--firmware: bios or uefi, not '$firmware'" ;;
esac
case "$watchdog" in
i6300esb) args+=(-device i6300esb -action watchdog=reset) ;;
none) ;;
*) die "--watchdog: i6300esb or none, not '$watchdog'" ;;
esac
qmp="$CACHE/run/$name.qmp"
if [[ -n "$qmp_events" ]]; then
    rm -f "$qmp"
    args+=(-qmp "unix:$qmp,server=on,wait=off")
fi
if [[ -n "$link" ]]; then
    args+=(-netdev "$(link_netdev "$link")" -device "virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:01")
fi
i=0
for f in "${nvme[@]}"; do
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
# QMP sends events only once capabilities are negotiated: a listener does that, then copies
# every line QEMU sends until it ends.
# shellcheck disable=SC2016 # Python, not shell
[[ -n "$qmp_events" ]] && setsid python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
f.write("{\"execute\": \"qmp_capabilities\"}\n")
f.flush()
with open(sys.argv[2], "a") as out:
    for line in f:
        out.write(line)
        out.flush()
' "$qmp" "$qmp_events" </dev/null >/dev/null 2>&1 &
stop_vm() { kill "$pid" 2>/dev/null || true; }

verdict=""
while :; do
    if grep -qF -- "$fail_marker" "$log"; then verdict=failmarker; break; fi
    if grep -qF -- "$wait_for" "$log"; then verdict=marker; break; fi
    if ! kill -0 "$pid" 2>/dev/null; then verdict=exited; break; fi
    if (($(date +%s) - start >= timeout)); then verdict=timeout; break; fi
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
    echo "appliance-vm: $name: TIMEOUT after ${timeout}s (log: $log); last lines:" >&2
    tail -n 20 "$log" >&2
    exit 124 ;;
*)
    stop_vm
    echo "appliance-vm: $name: unexpected outcome '$verdict' after ${elapsed}s (log: $log); last lines:" >&2
    tail -n 30 "$log" >&2
    exit 1 ;;
esac
