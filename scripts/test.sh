#!/usr/bin/env bash
# Set up and run the whole test suite: formatting, lints, the no_std build of core, unit,
# integration and crash tests, fuzz smoke runs and the QEMU guest tests.
# Every step has a time budget; the first failure stops the run. Builds that later steps need
# (the guests' static binaries, clippy, the fuzz targets) run in a background lane at low priority
# beside the earlier steps, each with its own budget; a step that needs one waits for it. The
# firmware QEMU step runs beside the four steps after it.
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
# Whatever way the run ends: the load and the background lane (below) end with it.
trap 'hogs_stop; bg_stop_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if ((under_load)); then
    export EDGEVOL_TEST_TIME_SCALE=${EDGEVOL_TEST_TIME_SCALE:-3}
    time_scale_load
    hogs_start
elif [[ -n "${EDGEVOL_TEST_TIME_SCALE:-}" ]]; then
    export EDGEVOL_TEST_TIME_SCALE
    log "budgets and real-time windows x$TIME_SCALE (EDGEVOL_TEST_TIME_SCALE)"
fi

started=$SECONDS
# cpu_ticks: busy and total ticks of all cores so far (/proc/stat), for each step's CPU use.
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit }' /proc/stat; }
step() {
    local budget name=$2 busy0 all0 busy1 all1
    budget=$(scaled "$1")
    shift 2
    log "$name"
    local t0=$SECONDS
    read -r busy0 all0 < <(cpu_ticks)
    if ! timeout --foreground "$budget" "$@"; then
        log "FAILED: $name (after $((SECONDS - t0)) s, budget $budget)"
        exit 1
    fi
    read -r busy1 all1 < <(cpu_ticks)
    log "ok: $name ($((SECONDS - t0)) s, cores $((100 * (busy1 - busy0) / (all1 - all0 + 1)))% busy)"
}

# The background: jobs run beside the steps, each a process group logged to target/ci/NAME.log.
# bg_start runs a build that later steps need, niced, so that it takes only the CPU the steps
# leave idle (a QEMU guest seldom keeps both cores busy, a compiler's last crates and links
# seldom both); bg_lane runs a step beside the steps that follow. bg_wait NAME fails the run if the
# job failed or ran past its budget, with the log's tail (a build) or the whole log (a lane).
declare -A BG_PID=() BG_LANE=()
bg_fork() { # NAME COMMAND...
    local name=$1
    shift
    mkdir -p target/ci
    # Its own process group (job control on for the fork), in this session: setsid would make
    # it an autogroup of its own, which the scheduler shares CPU with as an equal, whatever
    # its nice.
    set -m
    "$@" >"target/ci/$name.log" 2>&1 &
    BG_PID[$name]=$!
    set +m
}
bg_start() { # NAME NICE BUDGET COMMAND...
    local name=$1 nice=$2 budget=$3
    shift 3
    # Under --under-load the busy loops never leave a core idle: a niced job would never run.
    ((under_load)) && nice=0
    bg_fork "$name" nice -n "$nice" timeout "$budget" "$@"
    log "background: $name started at nice $nice, budget $budget s (log target/ci/$name.log)"
}
bg_lane() { # NAME BUDGET STEP COMMAND...: one step, at the script's priority
    local name=$1
    shift
    BG_LANE[$name]=1
    bg_fork "$name" step "$@"
    log "background lane $name started (log target/ci/$name.log)"
}
bg_wait() {
    local name=$1 t0=$SECONDS rc=0
    wait "${BG_PID[$name]}" || rc=$?
    unset "BG_PID[$name]"
    if [[ -n "${BG_LANE[$name]:-}" ]]; then
        log "background lane $name: its log"
        cat "target/ci/$name.log" >&2
    elif ((rc)); then
        tail -n 60 "target/ci/$name.log" >&2
    fi
    if ((rc)); then
        local why="exit $rc"
        ((rc == 124)) && why="past its budget"
        log "FAILED: background $name ($why; log target/ci/$name.log)"
        exit 1
    fi
    log "ok: $name (background; waited $((SECONDS - t0)) s for it)"
}
# bg_signal SIG: to every job still running (STOP before a step that measures rates, CONT after).
bg_signal() {
    local pid
    for pid in "${BG_PID[@]}"; do kill "-$1" -- "-$pid" 2>/dev/null || true; done
}
bg_stop_all() {
    bg_signal CONT
    bg_signal TERM
}

rust_setup
# A clean run's target/ and QEMU cache reach about 15 GiB: say what is free up front, so a full
# disk is not first seen as a compiler's "No space left on device" minutes later.
free_gib=$(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1048576) }')
log "disk: $free_gib GiB free under $ROOT (a clean run needs about 15)"
((free_gib >= 15)) || log "WARNING: under 15 GiB free: the run may fail for want of disk, not of a bug"
# One build per run: incremental state would only cost disk (GBs) and time.
export CARGO_INCREMENTAL=0
# Host builds link with mold: 0.7 CPU-s for an appliance test binary where rustc's default
# rust-lld takes 1.9, and there are about 90. Only in this run: the flag is part of every host
# artifact's fingerprint.
apt_need mold
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=-fuse-ld=mold"
rustup target list --installed | grep -qx thumbv7em-none-eabihf || rustup target add thumbv7em-none-eabihf

step 120 "cargo fmt --check" cargo fmt --all --check
step 300 "shellcheck: every shell file under scripts/, qemu/, image/ and deploy/" ./scripts/shellcheck.sh
apt_need python3
step 120 "docs: README on a screen, links, no issue numbers, ARCHITECTURE's crate table = cargo metadata" \
    python3 scripts/check-docs.py --self-test

# What the background lane builds with, installed here: apt and rustup must not run twice at once.
step 900 "QEMU prerequisites: Debian packages, the musl target, the pinned kernels" \
    bash -c './scripts/setup-qemu.sh >/dev/null'
# shellcheck disable=SC2086 # a list of package names
apt_need $EDGEVOL_IMAGE_APT_PACKAGES
# The background lane, by priority: the guests' static binaries (the QEMU steps wait for them),
# then clippy (a target directory of its own: no lock shared with the steps' cargo) and the fuzz
# targets' build, at nice 19 both. Their budgets are the serial steps' they replace, plus slack.
bg_start guest-binaries 10 "$(scaled 2400)" ./scripts/build-guest-binaries.sh
bg_start clippy 19 "$(scaled 3600)" env CARGO_TARGET_DIR="$ROOT/target/clippy" \
    cargo clippy --workspace --all-targets --locked -- -D warnings
bg_start fuzz-build 19 "$(scaled 3600)" ./scripts/fuzz.sh --build-smoke

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
step 300 "deploy: grpcio (gRPC C-core) over the unix sockets of edgevol proxy and edgevol-node; Kubernetes, Nomad and Swarm CreateVolume calls replayed" \
    ./scripts/test-deploy.sh grpcio
step 120 "deploy: Kubernetes manifests strictly valid for every promised minor, the sidecars' rules, consistency with the code, Nomad and Swarm files" \
    ./scripts/test-deploy.sh manifests
step 300 "deploy: monitoring rules checked and unit-tested (promtool), every metric of the rules and the Grafana dashboard served by a dev edgevold" \
    ./scripts/test-deploy.sh monitoring
step 600 "QEMU guest: Linux 6.12 DH-HMAC-CHAP against the edgevol target (refusals, rotation, every hash and DH group)" \
    ./scripts/test-auth-qemu.sh
# QoS limits are rates: the background lane is paused for this step.
bg_signal STOP
step 600 "QEMU guest: Linux NVMe/TCP initiator against the edgevol target (interop, nvme-cli, QoS limits with fio)" \
    ./scripts/test-nvme-qemu.sh
bg_signal CONT
bg_wait guest-binaries
step 600 "QEMU guest: hal on an emulated NVMe drive (identify, I/O, discard, SMART)" \
    ./scripts/test-hal-qemu.sh
step 1500 "QEMU end to end: appliance image + node VM, CSI life cycle, Node conformance, node faults" \
    ./scripts/test-e2e-qemu.sh
step 1500 "QEMU replicated volumes: two appliances, edgevol proxy, md RAID1 on a node VM; fio --verify through each box's outage and an appliance VM's power cut, resync, growth, snapshot restore" \
    ./scripts/test-replicated-qemu.sh
# A QEMU step keeps about one core busy (a TCG vCPU), so two run side by side: the firmware step
# beside the four below. Not the replicated step: its three guests and md resyncs need both cores
# within their time windows.
bg_lane firmware 1500 "QEMU firmware updates: bad bundles refused, good update kept (UEFI trial, a node VM writing through it), exiting and hanging (i6300esb) updates roll back, power cut while writing a slot, a pool format feature enabled only once committed and the rollback it forbids" \
    ./scripts/test-firmware-qemu.sh
step 900 "QEMU encrypted volumes: LUKS2 on a node VM with dm-crypt against an edgevold file pool; marker written, restaged and verified, no copy of it in the pool, wrong key refused, rotation, expansion, snapshot restore, no passphrase in logs, errors or state files" \
    ./scripts/test-encrypted-qemu.sh
step 300 "deploy: OCI images built offline (umoci), edgevol and edgevol-node run inside them, the node image's mkfs/mount/blkid" \
    ./scripts/test-deploy.sh images
step 1200 "QEMU faults under live I/O: kill -9 under fio, unpublish during I/O, edgevold killed on the appliance image (restarted in the same boot), appliance power cut" \
    ./scripts/test-faults-qemu.sh
step 420 "QEMU boot: the same disk image under SeaBIOS (syslinux) and OVMF (GRUB EFI), softdog or the i6300esb armed" \
    ./scripts/test-boot-qemu.sh
bg_wait firmware
bg_wait fuzz-build
step 600 "fuzz smoke: every target 15 s from its seed corpus (core metadata, NVMe/TCP PDUs, DH-HMAC-CHAP, firmware bundles, host-key file, :authority rewriter)" \
    ./scripts/fuzz.sh --smoke 15
bg_wait clippy

log "all tests passed in $((SECONDS - started)) s"
