#!/usr/bin/env bash
# Set up and run the whole test suite: formatting, lints, the no_std build of core, unit,
# integration and crash tests, fuzz smoke runs and the QEMU guest tests.
# Every step has a time budget; the first failure stops the run.
#
# usage: scripts/test.sh [--under-load]
#   --under-load  the same steps with a busy loop on every core beside them for the whole run (at
#                 this script's priority: nice 0 when started plainly), as on a machine that is
#                 also building something else; EDGEVOL_TEST_TIME_SCALE defaults to 3
# EDGEVOL_TEST_TIME_SCALE=N (a whole number, default 1) multiplies every step's budget; the tests,
# the QEMU scripts and the guests widen their real-time windows (keep-alive, waits) by it.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
under_load=0
opts_parse 'under-load!' "$@"

# The load: one busy loop per core. Each also ends by itself once this script is gone (even
# SIGKILLed); the EXIT trap ends them at once, whatever way the run ends.
HOGS=()
hogs_start() {
    local n i
    n=$(nproc)
    for ((i = 0; i < n; i++)); do
        # shellcheck disable=SC2016 # expanded by the loop's own sh
        sh -c 'while kill -0 "$1" 2>/dev/null; do i=0; while [ $i -lt 100000 ]; do i=$((i + 1)); done; done' \
            hog "$$" &
        HOGS+=("$!")
    done
    log "under load: a busy loop on each of the $n cores at nice $(nice) (pids ${HOGS[*]}), for the whole run; budgets and real-time windows x$TIME_SCALE"
}
hogs_stop() {
    if ((${#HOGS[@]})); then kill "${HOGS[@]}" 2>/dev/null || true; fi # gone is fine
    HOGS=()
}
if ((under_load)); then
    export EDGEVOL_TEST_TIME_SCALE=${EDGEVOL_TEST_TIME_SCALE:-3}
    time_scale_load
    trap hogs_stop EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    hogs_start
elif [[ -n "${EDGEVOL_TEST_TIME_SCALE:-}" ]]; then
    export EDGEVOL_TEST_TIME_SCALE
    log "budgets and real-time windows x$TIME_SCALE (EDGEVOL_TEST_TIME_SCALE)"
fi

started=$SECONDS
step() {
    local budget name=$2
    budget=$(scaled "$1")
    shift 2
    log "$name"
    local t0=$SECONDS
    if ! timeout --foreground "$budget" "$@"; then
        log "FAILED: $name (after $((SECONDS - t0)) s, budget $budget)"
        exit 1
    fi
    log "ok: $name ($((SECONDS - t0)) s)"
}

rust_setup
# A clean run's target/ and QEMU cache reach about 15 GiB: say what is free up front, so a full
# disk is not first seen as a compiler's "No space left on device" minutes later.
free_gib=$(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1048576) }')
log "disk: $free_gib GiB free under $ROOT (a clean run needs about 15)"
((free_gib >= 15)) || log "WARNING: under 15 GiB free: the run may fail for want of disk, not of a bug"
# One build per run: incremental state would only cost disk (GBs) and time.
export CARGO_INCREMENTAL=0
rustup target list --installed | grep -qx thumbv7em-none-eabihf || rustup target add thumbv7em-none-eabihf

step 120 "cargo fmt --check" cargo fmt --all --check
step 300 "shellcheck: every shell file under scripts/, qemu/, image/ and deploy/" ./scripts/shellcheck.sh
apt_need python3
step 120 "docs: README on a screen, links, no issue numbers, ARCHITECTURE's crate table = cargo metadata" \
    python3 scripts/check-docs.py --self-test
step 1200 "cargo clippy (warnings are errors)" cargo clippy --workspace --all-targets --locked -- -D warnings
step 300 "core builds for thumbv7em-none-eabihf (no_std)" \
    cargo build -p edgevol-core --target thumbv7em-none-eabihf --locked
step 60 "one rustls crypto provider (ring, no aws-lc-rs)" \
    bash -c '! cargo tree --workspace -e normal,build,dev -i aws-lc-rs >/dev/null 2>&1'
step 1800 "cargo test --workspace" cargo test --workspace --locked
step 900 "pool format features, test-feature-x build: its golden image read back, enabled only once the firmware slot is committed" \
    bash -c 'cargo test --locked -p edgevol-core --features test-feature-x --test golden_features && cargo test --locked -p edgevol-appliance --features test-feature-x --lib pool_features'
# Every benchmark in its short mode, so none can rot: built with the test profile (no release
# build in CI), never asserting timings.
step 600 "benchmarks, short mode" ./scripts/bench.sh --quick
step 1800 "fuzz smoke: every target 15 s from its seed corpus (core metadata, NVMe/TCP PDUs, DH-HMAC-CHAP, firmware bundles, host-key file, :authority rewriter)" \
    ./scripts/fuzz.sh --smoke 15
step 300 "deploy: grpcio (gRPC C-core) over the unix sockets of edgevol proxy and edgevol-node; Kubernetes, Nomad and Swarm CreateVolume calls replayed" \
    ./scripts/test-deploy.sh grpcio
step 120 "deploy: Kubernetes manifests strictly valid for every promised minor, the sidecars' rules, consistency with the code, Nomad and Swarm files" \
    ./scripts/test-deploy.sh manifests
step 300 "deploy: monitoring rules checked and unit-tested (promtool), every metric of the rules and the Grafana dashboard served by a dev edgevold" \
    ./scripts/test-deploy.sh monitoring
step 600 "QEMU guest: hal on an emulated NVMe drive (identify, I/O, discard, SMART)" \
    ./scripts/test-hal-qemu.sh
step 600 "QEMU guest: Linux NVMe/TCP initiator against the edgevol target (interop, nvme-cli, QoS limits with fio)" \
    ./scripts/test-nvme-qemu.sh
step 600 "QEMU guest: Linux 6.12 DH-HMAC-CHAP against the edgevol target (refusals, rotation, every hash and DH group)" \
    ./scripts/test-auth-qemu.sh
step 1500 "QEMU end to end: appliance image + node VM, CSI life cycle, Node conformance, node faults" \
    ./scripts/test-e2e-qemu.sh
step 1500 "QEMU replicated volumes: two appliances, edgevol proxy, md RAID1 on a node VM; fio --verify through each box's outage and an appliance VM's power cut, resync, growth, snapshot restore" \
    ./scripts/test-replicated-qemu.sh
step 900 "QEMU encrypted volumes: LUKS2 on a node VM with dm-crypt against an edgevold file pool; marker written, restaged and verified, no copy of it in the pool, wrong key refused, rotation, expansion, snapshot restore, no passphrase in logs, errors or state files" \
    ./scripts/test-encrypted-qemu.sh
# After the QEMU steps: the static binaries they built are the images' (cache hits).
step 300 "deploy: OCI images built offline (umoci), edgevol and edgevol-node run inside them, the node image's mkfs/mount/blkid" \
    ./scripts/test-deploy.sh images
step 1200 "QEMU faults under live I/O: kill -9 under fio, unpublish during I/O, edgevold killed on the appliance image (restarted in the same boot), appliance power cut" \
    ./scripts/test-faults-qemu.sh
step 420 "QEMU boot: the same disk image under SeaBIOS (syslinux) and OVMF (GRUB EFI), softdog or the i6300esb armed" \
    ./scripts/test-boot-qemu.sh
step 1500 "QEMU firmware updates: bad bundles refused, good update kept (UEFI trial, a node VM writing through it), exiting and hanging (i6300esb) updates roll back, power cut while writing a slot, a pool format feature enabled only once committed and the rollback it forbids" \
    ./scripts/test-firmware-qemu.sh

log "all tests passed in $((SECONDS - started)) s"
