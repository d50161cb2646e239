#!/usr/bin/env bash
# Firmware updates end to end in QEMU (TCG), the appliance driven over mTLS with its admin
# certificate (`edgevol firmware ...`), with QEMU's i6300esb as the box's hardware watchdog (its
# expiry a reset). QEMU runs with -no-reboot: a reboot (activate, a failed trial, the watchdog)
# ends the VM and the script boots the same disk again, as the box's firmware would; QEMU's QMP
# events (qmp-N.jsonl) tell a watchdog reset from a guest's own reboot. Checks, in order:
#   1. version 1 boots from slot A (BIOS) with /dev/watchdog on the i6300esb, armed by edgevold;
#      GetPluginInfo reports version 1; a truncated bundle, one for another architecture and
#      one signed with another key are refused and nothing is written (slot B stays empty);
#   2. update to version 2 + activate while a node VM (qemu/node-vm.sh, the real edgevol-node,
#      6.1 kernel initiator) has an ext4 volume mounted and writes fsynced files to it
#      (tests/e2e/tests/firmware_update.rs): slot B boots once under UEFI (OVMF, GRUB's
#      boot-once), passes its health check (20 s in tests/firmware/edgevold.toml) and becomes
#      primary; status says so and GetPluginInfo reports version 2; the node's writer went on by
#      itself (the kernel reconnected), no write failed, every fsynced file reads back, no I/O
#      error in its dmesg;
#   3. a bundle whose edgevold exits at start: its trial boot records the exit and reboots (no
#      watchdog); the box comes back on slot B by itself and status says "edgevold exited with
#      status 3";
#   4. a bundle whose edgevold hangs once serving (SIGSTOP before its health hold ends): it
#      stops petting the i6300esb, QEMU reports the watchdog's reset, the box comes back on slot
#      B and status says the trial ended before its health check passed;
#   5. power cut (QEMU killed) while the inactive slot is being written (the boot disk's writes
#      throttled so the write lasts): the box boots slot B, the cut slot reads "interrupted",
#      no trial is armed, and the loaders boot slot B;
#   6. a build that writes the test-only incompatible pool feature "test-feature-x" (its bundle
#      declares it): its trial boot leaves the pool at format version 3, and a rollback from the
#      trial works as before; updated again and committed, it enables the feature (version 4);
#      then a rollback to slot B (which cannot read it) is refused with the reason, and forced,
#      slot B boots, reports the pool's feature (POOL-UNSUPPORTED) and leaves the pool untouched.
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
# Serving and petting the watchdog (armed at its first healthy probe), then frozen before its
# trial health hold (20 s) ends.
until grep -q "watchdog armed" /run/edgevold.log 2>/dev/null; do sleep 0.2; done
sleep 3
echo "edgevold (test build): freezing" >&2
kill -STOP $p
wait $p'
# test-feature-x: version 2's initramfs with an edgevold that supports (and, once its slot is
# committed, enables) the test-only incompatible pool feature; its manifest declares it. Built in
# the shared target directory, whose third-party crates it reuses (edgevol-cli is selected as in
# the plain build, so that they resolve the same features; a directory of its own cost 7 min of
# CI). It lands where the plain edgevold is: under the guest build lock, the plain one is back in
# place (cargo relinks it even when nothing needs compiling) before another script copies it.
guest_build_lock
guest=(cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-appliance -p edgevol-cli)
CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}" \
    "${guest[@]}" --features edgevol-appliance/test-feature-x >&2
cp "$BIN/edgevold" "$run/edgevold-x"
CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}" "${guest[@]}" >&2
guest_build_unlock
x_rootfs="$run/x.rootfs"
mkdir -p "$x_rootfs"
(cd "$x_rootfs" && gzip -dc "$run/v2/initramfs.gz" | cpio -idm --quiet)
cp "$run/edgevold-x" "$x_rootfs/bin/edgevold"
echo "1.0.0-fwtestx" >"$x_rootfs/etc/edgevol/firmware-version"
(cd "$x_rootfs" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
    gzip -9 -n >"$run/x.initramfs.gz"
rm -rf "$x_rootfs"
"$BIN/edgevol" pki sign-firmware --key "$KEY" --kernel "$run/v2/vmlinuz" --initramfs "$run/x.initramfs.gz" \
    --version 1.0.0-fwtestx --out "$run/x.bundle" \
    --pool-format "edgevol-pool-format 1 versions 3-4 compatible 0x0 read-only-compatible 0x0 incompatible 0x8000000000000000" >/dev/null
head -c -1000 "$run/v2/edgevol.bundle" >"$run/truncated.bundle"
"$BIN/edgevol" pki sign-firmware --key "$KEY" --kernel "$run/v2/vmlinuz" --initramfs "$run/v2/initramfs.gz" \
    --version 1.0.0-arm --arch aarch64 --out "$run/arm.bundle" >/dev/null
"$BIN/edgevol" pki firmware-key --dir "$run/other-key" >/dev/null
"$BIN/edgevol" pki sign-firmware --key "$run/other-key/firmware-signing.key" --kernel "$run/v2/vmlinuz" \
    --initramfs "$run/v2/initramfs.gz" --version 1.0.0-forged --out "$run/forged.bundle" >/dev/null
# The node VM's static edgevol-node and e2e-agent, and the host side of its test.
CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}" \
    cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-node -p edgevol-e2e --bins >&2
cargo test --locked --workspace --test firmware_update --no-run >&2
say "builds done in $((SECONDS - t0)) s"
step_t=$SECONDS
# step_done N: how long step N took (BENCHMARKS.md).
step_done() {
    say "step $1 done in $((SECONDS - step_t)) s"
    step_t=$SECONDS
}

disk="$run/disk.img" nvme="$run/nvme.img"
cp --sparse=always "$run/v1/edgevol.img" "$disk"
truncate -s 1G "$nvme"
csi_port=$(free_port SOCK_STREAM) node_csi=$(free_port SOCK_STREAM) node_exec=$(free_port SOCK_STREAM)
link_a=$(free_port SOCK_DGRAM) link_n=$(free_port SOCK_DGRAM)
node_pidfile="$CACHE/run/fw-node.pid"
pidfile="$CACHE/run/fw.pid"
n=0
VM_PID=""
cleanup() {
    if [[ -n "$VM_PID" ]]; then kill "$VM_PID" 2>/dev/null || true; fi
    vms_stop
}
trap cleanup EXIT

# boot MARKER [TIMEOUT] [VM OPTIONS...]: boots the disk (a new log each time) until MARKER; the
# VM keeps running. Sets LOG, QMP (its QEMU events) and VM_PID (QEMU removes its pidfile when
# it ends).
boot() {
    local marker=$1 timeout=${2:-240}
    shift $(($# < 2 ? $# : 2))
    n=$((n + 1))
    LOG="$CACHE/logs/fw-$n.log" QMP="$run/qmp-$n.jsonl"
    "$ROOT/qemu/appliance-vm.sh" --name fw --disk "$disk" --nvme "$nvme" --csi-port "$csi_port" \
        --link "$link_a:$link_n" --log "$LOG" --pidfile "$pidfile" --qmp-events "$QMP" --wait-for "$marker" \
        --timeout "$timeout" --lifetime 600 "$@" >&2 ||
        fail "boot $n: no '$marker' (log $LOG)"
    # Empty if it already ended (a fast reboot right after the marker).
    VM_PID="$(cat "$pidfile" 2>/dev/null || true)"
}
# Waits (up to SECS, scaled) for the VM to end by itself: a reboot under -no-reboot.
wait_exit() {
    local deadline=$((SECONDS + $(scaled "$1")))
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
# GetPluginInfo's vendor_version must be VERSION (`edgevol status` prints it, observer role).
plugin_version() {
    local out
    out="$("$BIN/edgevol" status --appliance "127.0.0.1:$csi_port" --server-name localhost \
        --ca "$run/pki/pki/ca.pem" --cert "$run/pki/pki/observer.pem" --key "$run/pki/pki/observer.key" 2>&1)" ||
        fail "edgevol status: $out"
    grep -q "^appliance .* $1\$" <<<"$out" || fail "GetPluginInfo: expected vendor_version $1: $(grep '^appliance' <<<"$out")"
    say "ok: GetPluginInfo vendor_version $1"
}
# Whether QEMU reported its watchdog acting in the boot whose events are in QMP.
watchdog_fired() { grep -q '"event": *"WATCHDOG".*"action": *"reset"' "$QMP"; }
# node_test BUDGET NAME: one test of tests/e2e/tests/firmware_update.rs against the two VMs.
node_test() {
    local t=$SECONDS
    EDGEVOL_E2E_CSI="127.0.0.1:$csi_port" EDGEVOL_E2E_PKI="$run/pki/pki" \
        EDGEVOL_E2E_NODE_CSI="127.0.0.1:$node_csi" EDGEVOL_E2E_NODE_EXEC="127.0.0.1:$node_exec" \
        timeout --kill-after=10 "$(scaled "$1")" cargo test --locked --workspace --test firmware_update -- \
        --ignored --exact --nocapture "$2" >&2 || fail "node: $2 (logs $CACHE/logs/fw-node.log)"
    say "ok: node: $2 in $((SECONDS - t)) s"
}
# Waits (up to SECS, scaled) until `firmware status` contains TEXT.
status_has() {
    local deadline=$((SECONDS + $(scaled "$2"))) out=""
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
grep -q "EDGEVOL-APPLIANCE WATCHDOG i6300ESB timer" "$LOG" || fail "no i6300esb watchdog (log $LOG)"
wait_log "$LOG" "watchdog armed.*i6300ESB" 30 || fail "edgevold did not arm the i6300esb (log $LOG)"
say "ok: $(grep -a -m1 -o 'watchdog armed.*' "$LOG")"
appliance_id="$(persist_read "$disk" "$run/pki")" || fail "no PKI on the persistent partition"
status_has "running    slot A (version 1.0.0-fwtest1)" 30
plugin_version 1.0.0-fwtest1
for bad in truncated arm forged; do
    if out="$(fw update "$run/$bad.bundle" 2>&1)"; then fail "$bad bundle accepted: $out"; fi
    [[ "$out" == *"nothing written"* ]] || fail "$bad bundle: $out"
    say "ok: $bad bundle refused: ${out##*: }"
done
status_has "slot B     empty" 10
say "ok: slot B untouched"
step_done 1

# --- 2. a good update, while a node writes -----------------------------------------------------
vm_track "$node_pidfile"
"$ROOT/qemu/node-vm.sh" --name fw-node --bin-dir "$BIN" --link "$link_n:$link_a" \
    --csi-port "$node_csi" --exec-port "$node_exec" --appliance "$appliance_id" \
    --timeout 120 --lifetime 900 >&2 || fail "the node VM did not boot (log $CACHE/logs/fw-node.log)"
node_test 240 before_the_update_a_node_writes
t=$SECONDS
fw update "$run/v2/edgevol.bundle" >&2
say "update written in $((SECONDS - t)) s"
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE READY" 240 --firmware uefi
booted b
grep -q "EDGEVOL-APPLIANCE BOOTED slot=b firmware=uefi " "$LOG" || fail "the trial did not boot under UEFI"
node_test 400 after_the_update_the_node_resumes_and_its_data_verifies
vms_stop # the node VM is done: it would only share the 2 cores
status_has "slot B     good" 90
status_has "primary    slot B" 5
plugin_version 1.0.0-fwtest2
say "ok: version 2 booted once from slot B (UEFI, GRUB boot-once) and was kept after its health check"
step_done 2

# --- 3. an update whose daemon exits at start ---------------------------------------------------
fw update "$run/exits.bundle" >&2
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE ROLLBACK" 180
booted a
wait_exit 60
watchdog_fired && fail "the watchdog reset the exiting trial: init should have rebooted it"
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "edgevold exited with status 3" 30
status_has "slot A     bad" 5
say "ok: the exiting update rolled back to slot B by itself: $(fw status | grep 'last rollback')"
step_done 3

# --- 4. an update that hangs once serving -------------------------------------------------------
fw update "$run/hangs.bundle" >&2
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE READY"
booted a
t=$SECONDS
wait_exit 150
grep -q "edgevold (test build): freezing" "$LOG" || fail "the hung trial ended before it froze (log $LOG)"
watchdog_fired || fail "the hung trial ended, but not by the watchdog (events $QMP, log $LOG)"
say "the i6300esb reset the hung trial $((SECONDS - t)) s after its READY"
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "the trial boot ended before its health check passed" 30
say "ok: the hanging update rolled back to slot B by itself: $(fw status | grep 'last rollback')"
step_done 4

# --- 5. power cut while the inactive slot is written --------------------------------------------
# 2 MB/s to the boot disk: writing the 21 MB slot takes over 10 s; the cut lands 3 s in.
kill "$VM_PID"
wait_exit 10
boot "EDGEVOL-APPLIANCE READY" 240 --disk-write-bps $((2 << 20))
booted b
fw update "$run/v1/edgevol.bundle" >"$run/cut-update.log" 2>&1 &
update_pid=$!
wait_log "$LOG" "bundle received, verifying it and writing" 60 || fail "the update never reached the appliance (log $LOG)"
sleep 3
kill -KILL "$VM_PID"
wait "$update_pid" && fail "the update finished before the power cut: $(cat "$run/cut-update.log")"
say "power cut 3 s into writing slot A"
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "slot A     interrupted" 30
status_has "running    slot B (version 1.0.0-fwtest2), normal boot" 5
status_has "next boot  UEFI: slot B; BIOS: slot B" 5
fw status | grep -q "once" && fail "a trial is armed after the cut: $(fw status)"
say "ok: the cut update left slot A interrupted, no trial armed; slot B runs and boots next"
step_done 5

# --- 6. an update that writes a pool format feature, and the rollbacks around it ---------------
# The pool's format version: bytes 8..12 of its first superblock (core's superblock.rs).
pool_version() { od -An -tu4 -j8 -N4 "$nvme" | tr -d ' '; }
[[ "$(pool_version)" == 3 ]] || fail "the pool is format version $(pool_version) before the feature update"
feature_x_update() {
    fw update "$run/x.bundle" >&2
    fw activate >&2
    wait_exit 60
    boot "EDGEVOL-APPLIANCE READY"
    booted a
}
feature_x_update
# (The console shows edgevold's log through init's tail, which may lag behind READY.)
wait_log "$LOG" "pool features not enabled on a trial boot" 30 ||
    fail "the trial did not say it held the feature back (log $LOG)"
[[ "$(pool_version)" == 3 ]] || fail "the trial changed the pool to format version $(pool_version)"
fw rollback >&2
fw activate >&2
wait_exit 60
boot "EDGEVOL-APPLIANCE READY"
booted b
status_has "rollback requested by an admin" 30
say "ok: the trial of the feature build left the pool at version 3 and rolled back as before"
feature_x_update
status_has "slot A     good" 90
wait_log "$LOG" "pool incompatible feature test-feature-x (bit 63) enabled" 30 ||
    fail "the committed feature build did not enable test-feature-x (log $LOG)"
[[ "$(pool_version)" == 4 ]] || fail "the pool is format version $(pool_version) after the feature was enabled"
say "ok: committed, the feature build enabled test-feature-x (pool format version 4)"
if out="$(fw rollback 2>&1)"; then fail "rollback to a slot that cannot read the pool accepted: $out"; fi
[[ "$out" == *"slot B (version 1.0.0-fwtest2) cannot use the pool in use (the pool uses incompatible feature bit 63 (test-feature-x), which it does not support: it would refuse the pool); rollback refused, nothing changed. With --force"* ]] ||
    fail "rollback refusal: $out"
status_has "primary    slot A" 5
say "ok: rollback refused: ${out##*error: }"
fw rollback --force >&2
fw activate >&2
wait_exit 60
pool_before="$(head -c 64M "$nvme" | sha256sum)"
# Its edgevold refuses the pool (exit 78): init reports it and fails; the VM is stopped then.
boot "EDGEVOL-APPLIANCE READY" 240 --expect-fail
booted b
grep -a "EDGEVOL-APPLIANCE POOL-UNSUPPORTED" "$LOG" | grep -q "pool uses incompatible feature test-feature-x (bit 63), this firmware (version 1.0.0-fwtest2) does not support it" ||
    fail "the forced slot did not report the pool's feature (log $LOG)"
wait_exit 10
[[ "$(head -c 64M "$nvme" | sha256sum)" == "$pool_before" ]] || fail "the forced slot wrote to the pool"
say "ok: forced, slot B booted, said: $(grep -a -m1 -o 'POOL-UNSUPPORTED.*' "$LOG" | cut -c1-160)..., and left the pool untouched"
step_done 6
say "PASS in $((SECONDS - t0)) s"
