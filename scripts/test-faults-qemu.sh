#!/usr/bin/env bash
# Faults under live I/O (project issue 13), in QEMU TCG guests with the pinned Debian kernel and
# Debian's nvme-cli and fio. appliance/tests/faults_qemu.rs runs edgevold as a real process on
# this host (dev mode, file-backed pool, dev PKI), creates and publishes volumes over CSI with
# mTLS, and boots a guest (qemu/faults-guest.sh) that reaches the target at 10.0.2.2 (slirp):
#   1a. kill -9 of edgevold three times (restarted on the same data dir) under fio 4k random
#       overwrites of a flushed region, no fsync/FUA, --verify=crc32c: zero verify errors, fio
#       exit 0 and err=0, a reconnect per kill and no I/O error in the guest's dmesg;
#   1b. the same with allocating writes on a fresh thin volume, never flushed;
#   2.  ControllerUnpublishVolume while the guest writes (connected with fast_io_fail_tmo=5):
#       fio gets EIO within 15 s of the call, the target refuses the reconnects (guest dmesg and
#       the appliance log).
# Prints one 'FAULTS PASS|FAIL <check>: <figures>' line per check. Then:
#   3.  power cut: the appliance firmware image VM (qemu/appliance-vm.sh, emulated NVMe drive)
#       and a node VM (qemu/node-vm.sh, edgevol-node); the node writes fsynced files on an ext4
#       volume and fsynced raw batches on a block volume; QEMU of the appliance VM gets SIGKILL,
#       the VM boots again from the same disks; every fsynced byte must read back, the node must
#       resume by itself without I/O errors, fsck.ext4 -n must be clean
#       (tests/e2e/tests/powercut.rs, qemu/faults-powercut-node.sh).
# Every step and VM has a time budget; a failed check does not stop the next one. Logs:
# qemu/.cache/logs/faults-guest.log, faults-edgevold.log, faults-pc-*.log.
# Installs what it needs (scripts/setup-qemu.sh, apt: nvme-cli, fio, util-linux, e2fsprogs,
# xfsprogs). Exit 0 = every check passed.
#
# usage: scripts/test-faults-qemu.sh [--skip-power-cut] [--only-power-cut]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
skip_power_cut=0 only_power_cut=0
opts_parse 'skip-power-cut! only-power-cut!' "$@"
do_kill=$((!only_power_cut)) do_cut=$((!skip_power_cut))
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
say() { echo "==> faults: $*" >&2; }
t0=$SECONDS

step() { # BUDGET NAME COMMAND...
    local budget name=$2 t=$SECONDS
    budget=$(scaled "$1")
    shift 2
    say "$name"
    if ! timeout --foreground --kill-after=10 "$budget" "$@"; then
        say "FAILED: $name (after $((SECONDS - t)) s, budget $budget s)"
        return 1
    fi
    say "ok: $name ($((SECONDS - t)) s)"
}

"$ROOT/scripts/setup-qemu.sh" >/dev/null
# nvme-cli and fio are copied into the guest of checks 1-2; the node VM of check 3 runs the host's
# util-linux, e2fsprogs and xfsprogs (qemu/node-vm.sh copies them).
apt_need nvme-cli fio util-linux e2fsprogs xfsprogs
status=0

# --- 1, 2: edgevold on the host, killed and unpublished under a guest's I/O -------------------
if ((do_kill)); then
    step 900 "build the host test (and edgevold)" \
        cargo test --locked --workspace --test faults_qemu --no-run || exit 1
    # Guest boot ~10 s, each workload ~45 s with its three kills, the unpublish ~20 s; the
    # test's own guest budget is 540 s.
    step 600 "checks 1 and 2: kill -9 under fio verify (overwrite, allocate), unpublish during I/O" \
        cargo test --locked --workspace --test faults_qemu -- --ignored --nocapture ||
        status=1
fi

# --- 3: a daemon crash and a power cut of the appliance VM under a node VM's fsynced writes -----
trap vms_stop EXIT
# crash_wrapper INITRAMFS RUN: slot A of RUN/disk.img gets INITRAMFS with edgevold behind a
# wrapper that SIGKILLs it once it has logged the creation of a volume of 7 MiB (the test's
# trigger: the host has no other way into the VM), as a panic or an OOM kill would end it. The
# image's init must start it again in the same boot.
crash_wrapper() {
    local d="$2/crash.rootfs"
    rm -rf "$d"
    mkdir -p "$d"
    (cd "$d" && gzip -dc "$1" | cpio -idm --quiet) || return 1
    mv "$d/bin/edgevold" "$d/bin/edgevold.real"
    cat >"$d/bin/edgevold" <<'WRAPPER'
#!/bin/sh
# Test build (scripts/test-faults-qemu.sh): edgevold, SIGKILLed when it creates a 7 MiB volume.
from=$(($(wc -c </run/edgevold.log) + 1))
/bin/edgevold.real "$@" &
p=$!
(
    until tail -c +"$from" /run/edgevold.log | grep -q "volume created.*bytes=7340032"; do
        kill -0 $p 2>/dev/null || exit 0
        sleep 0.1
    done
    echo "edgevold (test build): SIGKILL on the trigger" >&2
    kill -KILL $p
) &
wait $p
WRAPPER
    chmod 0755 "$d/bin/edgevold"
    (cd "$d" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
        gzip -1 -n >"$2/crash-initramfs.gz" || return 1
    rm -rf "$d"
    mcopy -o -i "$2/disk.img@@1M" "$2/crash-initramfs.gz" ::/slot-a/initramfs.gz
}
power_cut() {
    local run="$CACHE/faults-pc" image="$CACHE/faults-image"
    rm -rf "$run"
    mkdir -p "$run" "$CACHE/logs" "$CACHE/run"
    # A private image output: scripts/test-e2e-qemu.sh may be building image/out concurrently.
    step 1800 "build the image, static edgevol-node and e2e-agent, the host test" bash -c "
        '$ROOT/image/build.sh' --out '$image' \
            --config '$ROOT/tests/e2e/edgevold-unauthenticated.toml' >'$run/image-sizes.txt' &&
        CC_x86_64_unknown_linux_musl=\${CC_x86_64_unknown_linux_musl:-musl-gcc} \
            cargo build --release --locked --target $EDGEVOL_GUEST_TARGET -p edgevol-node \
            -p edgevol-e2e --bins &&
        cargo test --locked --workspace --test powercut --no-run" || return 1
    local bin="$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release"
    local csi_port node_csi node_exec link_a link_n
    csi_port=$(free_port SOCK_STREAM) node_csi=$(free_port SOCK_STREAM) node_exec=$(free_port SOCK_STREAM)
    link_a=$(free_port SOCK_DGRAM) link_n=$(free_port SOCK_DGRAM)
    cp "$image/edgevol.img" "$run/disk.img"
    crash_wrapper "$image/initramfs.gz" "$run" || return 1
    truncate -s 1G "$run/nvme0.img"
    local apid="$CACHE/run/faults-pc-appliance.pid" npid="$CACHE/run/faults-pc-node.pid"
    vm_track "$apid"
    vm_track "$npid"
    # The same disks, ports and pidfile for the boot after the cut (the test runs it).
    local boot=("$ROOT/qemu/appliance-vm.sh" --disk "$run/disk.img" --nvme "$run/nvme0.img"
        --csi-port "$csi_port" --link "$link_a:$link_n" --pidfile "$apid" --mem 512 --timeout 150)
    step 180 "power cut: first boot of the appliance VM (blank drive: PKI, format)" \
        "${boot[@]}" --name faults-pc-appliance --lifetime 900 || return 1
    wait_log "$CACHE/logs/faults-pc-appliance.log" "pool open: ready" 30 ||
        { say "FAIL: the appliance VM's pool did not open"; return 1; }
    # The client PKI from the persistent partition, as scripts/test-e2e-qemu.sh takes it.
    local appliance_id
    appliance_id=$(persist_read "$run/disk.img" "$run") || { say "FAIL: no PKI or appliance id"; return 1; }
    step 150 "power cut: boot the node VM" \
        "$ROOT/qemu/node-vm.sh" --name faults-pc-node --bin-dir "$bin" --link "$link_n:$link_a" \
        --csi-port "$node_csi" --exec-port "$node_exec" --appliance "$appliance_id" \
        --timeout 120 --lifetime 900 || return 1
    local reboot
    printf -v reboot '%q ' "${boot[@]}" --name faults-pc-appliance-2 --lifetime 600
    EDGEVOL_E2E_CSI="127.0.0.1:$csi_port" EDGEVOL_E2E_PKI="$run/pki" \
        EDGEVOL_E2E_NODE_CSI="127.0.0.1:$node_csi" EDGEVOL_E2E_NODE_EXEC="127.0.0.1:$node_exec" \
        EDGEVOL_PC_APPLIANCE_PIDFILE="$apid" EDGEVOL_PC_REBOOT="$reboot" \
        EDGEVOL_PC_APPLIANCE_LOG="$CACHE/logs/faults-pc-appliance.log" \
        step 600 "check 3a: edgevold SIGKILLed on the appliance image under acknowledged writes" \
        cargo test --locked --workspace --test powercut -- --ignored --nocapture --exact \
        a_daemon_crash_on_the_appliance_loses_no_acknowledged_write || return 1
    EDGEVOL_E2E_CSI="127.0.0.1:$csi_port" EDGEVOL_E2E_PKI="$run/pki" \
        EDGEVOL_E2E_NODE_CSI="127.0.0.1:$node_csi" EDGEVOL_E2E_NODE_EXEC="127.0.0.1:$node_exec" \
        EDGEVOL_PC_APPLIANCE_PIDFILE="$apid" EDGEVOL_PC_REBOOT="$reboot" \
        step 720 "check 3: power cut of the appliance VM under fsynced writes (ext4 files, raw)" \
        cargo test --locked --workspace --test powercut -- --ignored --nocapture --exact \
        power_cut_of_the_appliance_under_fsynced_writes
}
if ((do_cut)); then
    if power_cut; then
        say "PASS 3 power cut (logs: $CACHE/logs/faults-pc-*.log)"
    else
        say "FAIL 3 power cut (logs: $CACHE/logs/faults-pc-*.log)"
        status=1
    fi
    vms_stop
fi

if ((status)); then
    say "FAIL after $((SECONDS - t0)) s (verdicts: the FAULTS lines and check 3 above)"
else
    say "PASS in $((SECONDS - t0)) s"
fi
exit "$status"
