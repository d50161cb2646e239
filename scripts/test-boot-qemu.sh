#!/usr/bin/env bash
# The same firmware disk image boots under SeaBIOS (syslinux) and OVMF (GRUB EFI), in QEMU (TCG):
#   1. image/build.sh; one raw disk and one blank NVMe drive;
#   2. BIOS: first boot (PKI, format) from slot A: `BOOTED slot=a firmware=bios`, READY; on a
#      board without a hardware watchdog (no i6300esb): softdog stands in, edgevold arms it;
#   3. UEFI, the same disk file: `BOOTED slot=a firmware=uefi`, READY (the pool opened, not
#      formatted again); the i6300esb is the watchdog, edgevold arms it;
#   4. BIOS again: READY. Boot-to-ready of steps 3 and 4 (later boots) is printed for each
#      firmware type (BENCHMARKS.md).
# Every boot has a time budget. Logs: qemu/.cache/logs/boot-*.log. Exit 0 = PASS.
#
# usage: scripts/test-boot-qemu.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
opts_parse '' "$@"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
run="$CACHE/boot"
rm -rf "$run"
mkdir -p "$run" "$CACHE/logs"
say() { echo "==> boot: $*" >&2; }
t0=$SECONDS

say "building the image"
"$ROOT/image/build.sh" --out "$run/image" >"$run/image-sizes.txt"
cat "$run/image-sizes.txt" >&2
disk="$run/image/edgevol.img" nvme="$run/nvme.img"
truncate -s 1G "$nvme"

# boot NAME FIRMWARE WATCHDOG: boot the disk until READY (budget 240 s) on a board with the
# WATCHDOG (i6300esb or none), stop the VM, check the markers of the slot and firmware the guest
# saw and that edgevold armed the watchdog the image chose (softdog without a hardware one);
# prints boot_ms.
boot() {
    local name=$1 firmware=$2 watchdog=$3 log="$CACHE/logs/boot-$1.log" driver="i6300ESB timer"
    [[ $watchdog == none ]] && driver="Software Watchdog"
    local pidfile="$CACHE/run/boot-$name.pid"
    # boot runs in $(...): its own trap stops its VM on any way out.
    trap vms_stop EXIT
    vm_track "$pidfile"
    "$ROOT/qemu/appliance-vm.sh" --name "boot-$name" --firmware "$firmware" --disk "$disk" \
        --nvme "$nvme" --log "$log" --pidfile "$pidfile" --timeout 240 --lifetime 300 \
        --watchdog "$watchdog" >&2 ||
        { say "FAIL: $name: no READY (log $log)"; exit 1; }
    # edgevold arms the watchdog while its pool opens: the line may follow READY.
    wait_log "$log" "watchdog armed.*$driver" 30 || { say "FAIL: $name: '$driver' not armed"; exit 1; }
    vms_stop
    grep -q "EDGEVOL-APPLIANCE BOOTED slot=a firmware=$firmware " "$log" ||
        { say "FAIL: $name: no 'BOOTED slot=a firmware=$firmware' marker"; grep BOOTED "$log" >&2; exit 1; }
    grep -q "EDGEVOL-APPLIANCE WATCHDOG $driver " "$log" ||
        { say "FAIL: $name: no 'WATCHDOG $driver' marker"; grep WATCHDOG "$log" >&2; exit 1; }
    grep -o 'READY boot_ms=[0-9]*' "$log" | head -1 | cut -d= -f2
}

ms=$(boot bios-first bios none)
say "ok: BIOS (SeaBIOS + syslinux) first boot, slot A, no hardware watchdog (softdog armed): ready after ${ms} ms (PKI + format)"
uefi_ms=$(boot uefi uefi i6300esb)
grep -q "FIRST-BOOT" "$CACHE/logs/boot-uefi.log" && { say "FAIL: UEFI boot redid the first boot"; exit 1; }
say "ok: UEFI (OVMF + GRUB EFI) boot of the same disk, slot A, i6300esb armed: ready after ${uefi_ms} ms"
bios_ms=$(boot bios bios i6300esb)
say "ok: BIOS boot again: ready after ${bios_ms} ms"
say "boot-to-ready (later boot, TCG): bios ${bios_ms} ms, uefi ${uefi_ms} ms"
say "PASS in $((SECONDS - t0)) s"
