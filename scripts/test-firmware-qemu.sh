#!/usr/bin/env bash
# Firmware updates end to end in QEMU (TCG, BIOS boot), the appliance driven over mTLS with its
# admin certificate (`edgevol firmware ...`). QEMU runs with -no-reboot: a reboot (activate, a
# failed trial, the watchdog) ends the VM and the script boots the same disk again, as the box's
# firmware would. Checks, in order:
#   1. version 1 boots from slot A; a truncated bundle, one for another architecture and one
#      signed with another key are refused and nothing is written (slot B stays empty);
#   2. update to version 2 + activate: slot B boots once, passes its health check (20 s in
#      tests/firmware/edgevold.toml) and becomes primary; status says so;
#   3. a bundle whose edgevold exits at start: its trial boot records the exit and reboots; the
#      box comes back on slot B by itself and status says "edgevold exited with status 3";
#   4. a bundle whose edgevold hangs once serving (SIGSTOP before its health hold ends): it stops
#      petting the watchdog (softdog, 60 s), the box resets and comes back on slot B, status says
#      the trial ended before its health check passed.
# Every boot and wait has a time budget. Logs: qemu/.cache/logs/fw-*.log. Exit 0 = PASS.
#
# usage: scripts/test-firmware-qemu.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
opts_parse '' "$@"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
run="$CACHE/fw"
rm -rf "$run"
mkdir -p "$run" "$CACHE/logs"
say() { echo "==> firmware: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
t0=$SECONDS
BIN="$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release"
KEY="$CACHE/firmware-dev-key/firmware-signing.key"

# --- builds: version 1 (the disk), version 2 (a bundle), broken bundles -----------------------
say "building images"
"$ROOT/image/build.sh" --out "$run/v1" --version 1.0.0-fwtest1 --config "$ROOT/tests/firmware/edgevold.toml" \
    >"$run/image-sizes.txt"
"$ROOT/image/build.sh" --out "$run/v2" --version 1.0.0-fwtest2 --config "$ROOT/tests/firmware/edgevold.toml" \
    >/dev/null

# broken NAME SCRIPT: version 2's initramfs with bin/edgevold replaced by SCRIPT (the real one
# kept as bin/edgevold.real), signed as version NAME.
broken() {
    local name=$1 script=$2 d="$run/$1.rootfs"
    mkdir -p "$d"
    (cd "$d" && gzip -dc "$run/v2/initramfs.gz" | cpio -idm --quiet)
    mv "$d/bin/edgevold" "$d/bin/edgevold.real"
    printf '%s\n' "$script" >"$d/bin/edgevold"
    chmod 0755 "$d/bin/edgevold"
    echo "1.0.0-$name" >"$d/etc/edgevol/firmware-version"
    (cd "$d" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
        gzip -9 -n >"$run/$name.initramfs.gz"
    "$BIN/edgevol" pki sign-firmware --key "$KEY" --kernel "$run/v2/vmlinuz" \
        --initramfs "$run/$name.initramfs.gz" --version "1.0.0-$name" --out "$run/$name.bundle" >/dev/null
    rm -rf "$d"
}
broken exits '#!/bin/sh
echo "edgevold (test build): exiting at start" >&2
exit 3'
# shellcheck disable=SC2016 # a script for the guest, expanded there
broken hangs '#!/bin/sh
/bin/edgevold.real "$@" &
p=$!
# Serving (and petting the watchdog), then frozen before its trial health hold (20 s) ends.
until grep -q "pool open: ready" /run/edgevold.log 2>/dev/null; do sleep 0.2; done
sleep 3
echo "edgevold (test build): freezing" >&2
kill -STOP $p
wait $p'
head -c -1000 "$run/v2/edgevol.bundle" >"$run/truncated.bundle"
"$BIN/edgevol" pki sign-firmware --key "$KEY" --kernel "$run/v2/vmlinuz" --initramfs "$run/v2/initramfs.gz" \
    --version 1.0.0-arm --arch aarch64 --out "$run/arm.bundle" >/dev/null
"$BIN/edgevol" pki firmware-key --dir "$run/other-key" >/dev/null
"$BIN/edgevol" pki sign-firmware --key "$run/other-key/firmware-signing.key" --kernel "$run/v2/vmlinuz" \
    --initramfs "$run/v2/initramfs.gz" --version 1.0.0-forged --out "$run/forged.bundle" >/dev/null
say "builds done in $((SECONDS - t0)) s"

disk="$run/disk.img" nvme="$run/nvme.img"
cp --sparse=always "$run/v1/edgevol.img" "$disk"
truncate -s 1G "$nvme"
csi_port=$(free_port SOCK_STREAM)
pidfile="$CACHE/run/fw.pid"
n=0
VM_PID=""
cleanup() { if [[ -n "$VM_PID" ]]; then kill "$VM_PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

# boot MARKER [TIMEOUT]: boots the disk (a new log each time) until MARKER; the VM keeps running.
# Sets LOG and VM_PID (QEMU removes its pidfile when it ends).
boot() {
    n=$((n + 1))
    LOG="$CACHE/logs/fw-$n.log"
    "$ROOT/qemu/appliance-vm.sh" --name fw --disk "$disk" --nvme "$nvme" --csi-port "$csi_port" \
        --log "$LOG" --pidfile "$pidfile" --wait-for "$1" --timeout "${2:-240}" --lifetime 600 >&2 ||
        fail "boot $n: no '$1' (log $LOG)"
    # Empty if it already ended (a fast reboot right after the marker).
    VM_PID="$(cat "$pidfile" 2>/dev/null || true)"
}
# Waits (up to SECS) for the VM to end by itself: a reboot under -no-reboot.
wait_exit() {
    local deadline=$((SECONDS + $1))
    while [[ -n "$VM_PID" ]] && kill -0 "$VM_PID" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "the VM did not reboot within $1 s (log $LOG)"
        sleep 1
    done
}
booted() { grep -q "EDGEVOL-APPLIANCE BOOTED slot=$1 " "$LOG" || fail "expected slot $1 (log $LOG): $(grep -a BOOTED "$LOG")"; }
fw() {
    "$BIN/edgevol" firmware "$@" --appliance "127.0.0.1:$csi_port" --server-name localhost \
        --ca "$run/pki/pki/ca.pem" --cert "$run/pki/pki/admin.pem" --key "$run/pki/pki/admin.key"
}
# Waits (up to SECS) until `firmware status` contains TEXT.
status_has() {
    local deadline=$((SECONDS + $2)) out=""
    while ((SECONDS < deadline)); do
        out="$(fw status 2>&1)" && [[ "$out" == *"$1"* ]] && return 0
        sleep 2
    done
    echo "$out" >&2
    fail "firmware status never said '$1'"
}

# --- 1. version 1, refused bundles ------------------------------------------------------------
boot "EDGEVOL-APPLIANCE READY"
booted a
persist_read "$disk" "$run/pki" >/dev/null || fail "no PKI on the persistent partition"
status_has "running    slot A (version 1.0.0-fwtest1)" 30
for bad in truncated arm forged; do
    if out="$(fw update "$run/$bad.bundle" 2>&1)"; then fail "$bad bundle accepted: $out"; fi
    [[ "$out" == *"nothing written"* ]] || fail "$bad bundle: $out"
    say "ok: $bad bundle refused: ${out##*: }"
done
status_has "slot B     empty" 10
say "ok: slot B untouched"

# --- 2. a good update -------------------------------------------------------------------------
t=$SECONDS
fw update "$run/v2/edgevol.bundle" >&2
say "update written in $((SECONDS - t)) s"
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "slot B     good" 90
status_has "primary    slot B" 5
say "ok: version 2 booted once from slot B and was kept after its health check"

# --- 3. an update whose daemon exits at start ---------------------------------------------------
fw update "$run/exits.bundle" >&2
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE ROLLBACK" 180
booted a
wait_exit 60
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "edgevold exited with status 3" 30
status_has "slot A     bad" 5
say "ok: the exiting update rolled back to slot B by itself: $(fw status | grep 'last rollback')"

# --- 4. an update that hangs once serving -------------------------------------------------------
fw update "$run/hangs.bundle" >&2
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE READY"
booted a
t=$SECONDS
wait_exit 150
say "the watchdog reset the hung trial after $((SECONDS - t)) s"
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "the trial boot ended before its health check passed" 30
say "ok: the hanging update rolled back to slot B by itself: $(fw status | grep 'last rollback')"
say "PASS in $((SECONDS - t0)) s"
