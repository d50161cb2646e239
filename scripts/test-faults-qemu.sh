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
# Prints one 'FAULTS PASS|FAIL <check>: <figures>' line per check. Every step and VM has a time
# budget. Logs: qemu/.cache/logs/faults-guest.log, qemu/.cache/logs/faults-edgevold.log.
# Installs what it needs (scripts/setup-qemu.sh, apt: nvme-cli, fio). Exit 0 = every check passed.
#
# usage: scripts/test-faults-qemu.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
say() { echo "==> faults: $*" >&2; }
t0=$SECONDS

step() { # BUDGET NAME COMMAND...
    local budget=$1 name=$2 t=$SECONDS
    shift 2
    say "$name"
    if ! timeout --foreground --kill-after=10 "$budget" "$@"; then
        say "FAILED: $name (after $((SECONDS - t)) s, budget $budget s)"
        return 1
    fi
    say "ok: $name ($((SECONDS - t)) s)"
}

"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need nvme-cli fio
step 900 "build the host test (and edgevold)" \
    cargo test --locked -p edgevol-appliance --test faults_qemu --no-run
# Guest boot ~40 s, each workload ~60 s with its three kills, the unpublish ~30 s; the test's
# own guest budget is 540 s.
status=0
step 600 "checks 1 and 2: kill -9 under fio verify (overwrite, allocate), unpublish during I/O" \
    cargo test --locked -p edgevol-appliance --test faults_qemu -- --ignored --nocapture ||
    status=1
if ((status)); then
    say "FAIL after $((SECONDS - t0)) s (verdicts: the FAULTS lines above)"
else
    say "PASS in $((SECONDS - t0)) s"
fi
exit "$status"
