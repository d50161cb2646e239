#!/usr/bin/env bash
# hal in a QEMU TCG guest with an emulated NVMe drive: identify (serial/EUI64/UUID checked against
# what QEMU was given), write/read/discard through the hal backend, concurrent I/O through
# edgevold's data-path handle, SMART; and on a single-queue virtio-blk disk (kernel default
# mq-deadline), that opening it for a pool selects the `none` I/O scheduler.
# With --bench, also runs hal-bench on the emulated NVMe (and on a host tmpfs file) and prints
# both tables. Installs what it needs via scripts/setup-qemu.sh. Exit 0 = PASS.
#
# usage: scripts/test-hal-qemu.sh [--bench] [--timeout SECS]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench=0 timeout=120
opts_parse 'bench! timeout' "$@"

"$ROOT/scripts/setup-qemu.sh" >/dev/null
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
# Static musl binaries: nothing to copy into the initramfs but the executables themselves.
cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-hal-tools --bins >&2
BIN="$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release"

mkdir -p "$CACHE/disks"
disk="$CACHE/disks/hal-nvme.img"
rm -f "$disk"
truncate -s 512M "$disk"
SERIAL=EDGEVOLTEST01
EUI64=0011223344556677
UUID=5e1f0c2a-7b3d-4e8a-9c61-0d2f4a6b8c10

vdisk="$CACHE/disks/hal-virtio.img"
rm -f "$vdisk"
truncate -s 64M "$vdisk"

cmd="for i in \$(seq 100); do [ -b /dev/vda ] && break; sleep 0.1; done;"
cmd="$cmd timeout $(scaled 30) hal-guest-check --scheduler /dev/vda && timeout $(scaled 60) hal-guest-check /dev/nvme0n1 $SERIAL $EUI64 $UUID"
marker="HAL-GUEST-CHECK PASS"
if ((bench)); then
    cmd="$cmd && timeout 150 hal-bench /dev/nvme0n1 --size-mib 256 --secs ${HAL_BENCH_SECS:-1} && echo HAL-BENCH-DONE"
    marker="HAL-BENCH-DONE"
    timeout=$((timeout + 150))
fi
rc=0
"$ROOT/qemu/run-guest.sh" --name hal-nvme --timeout "$timeout" --mem 512 --smp 2 \
    --bin "$BIN/hal-guest-check" --bin "$BIN/hal-bench" --module virtio_pci --module virtio_blk \
    --cmd "$cmd" --pass-marker "$marker" --fail-marker "HAL-GUEST-CHECK FAIL" -- \
    -drive "file=$disk,if=none,id=d0,format=raw,discard=unmap,cache=none,aio=threads" \
    -device "nvme,id=nvme0,serial=$SERIAL" \
    -device "nvme-ns,drive=d0,bus=nvme0,nsid=1,eui64=0x$EUI64,uuid=$UUID" \
    -drive "file=$vdisk,if=none,id=v0,format=raw" -device virtio-blk-pci,drive=v0,serial=EVSCHED,num-queues=1 || rc=$?
grep -E '^(scheduler|controller|namespace|  lbaf|sync|discard|data handle|smart after|HAL-|\|)' "$CACHE/logs/hal-nvme.log" || true
if ((bench)); then
    echo "--- host tmpfs (/dev/shm) ---"
    "$BIN/hal-bench" /dev/shm/edgevol-hal-bench.img --size-mib 256 --secs "${HAL_BENCH_SECS:-1}"
    rm -f /dev/shm/edgevol-hal-bench.img
fi
rm -f "$disk" "$vdisk"
exit $rc
