#!/usr/bin/env bash
# Data path in QEMU and the image's footprint (the full mode of scripts/bench.sh; not in CI).
#
# 1. Data path: an appliance VM (qemu/run-guest.sh + qemu/bench-appliance-guest.sh: static musl
#    edgevold, nvmet + nvmet-tcp modules) with two identical raw virtio-blk backing files:
#    edgevold's pool on one (NVMe/TCP :4420), the kernel's nvmet-tcp exporting the other (:4421).
#    A node VM (qemu/node-vm.sh --bench: edgevol-node, e2e-agent, the host's fio) on the dgram
#    storage link. tests/e2e/tests/bench_qemu.rs creates and publishes a volume through CSI over
#    mTLS from the host (PKI made on the host), connects both targets in the node VM and runs fio
#    (4k randread/randwrite QD1 and QD16, 128k seq read/write QD8) RUNS times each per target,
#    targets interleaved, in two passes per workload:
#    a. unpaced: throughput, with how busy the node VM was (>= 70 %: the row is initiator-bound);
#    b. paced at 60 % of the slower target's unpaced median, the same pace for both: the
#       appliance VM's CPU time per I/O (its /proc/stat, read through an e2e-agent in it right
#       before and after each fio run) and, for the QD1 4k rows, completion latency p50 / p99.
# 2. Footprint: image/build.sh, then boot-to-ready (the `EDGEVOL-APPLIANCE READY boot_ms=` of
#    image/init, guest uptime) of the image under qemu/appliance-vm.sh: one first boot (PKI
#    generation + pool format) and 3 later boots; the median of the later boots is reported.
# Prints markdown tables on stdout (logs on stderr); every VM and step has a time budget.
#
# usage: scripts/bench-qemu.sh [--secs N] [--runs N] [--only NAMES] [--busy-poll-us N] [--profile] [--tap] [--skip-data-path] [--skip-boot]
#   --secs  fio runtime per run (default 10)    --runs  runs per workload and target (default 3)
#   --only  comma-separated workload names, e.g. '4k randread QD1,4k randwrite QD1' (default: all)
#   --busy-poll-us  edgevold's nvme.busy_poll_us in the appliance VM (default: edgevold's)
#   --profile  after each workload's paced runs, one more paced run per target under the host's
#              perf (`perf record -a -e cpu-clock` in the appliance VM; its report goes to the
#              log). Kept out of the measured runs: perf's own CPU time would be in them.
#   --tap      the storage link on two taps and a bridge (root) instead of UDP datagrams: the
#              guests' NICs then have checksum and segmentation offloads, as real NICs do; over
#              datagrams both targets spend much of their CPU computing checksums and segmenting.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
secs=10 runs=3 only='' busy_poll_us='' profile=0 tap=0 skip_data_path=0 skip_boot=0 failed=0
opts_parse 'secs runs only busy-poll-us profile! tap! skip-data-path! skip-boot!' "$@"
do_data=$((!skip_data_path)) do_boot=$((!skip_boot))
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}"
run="$CACHE/bench-qemu"
rm -rf "$run"
mkdir -p "$run" "$CACHE/logs" "$CACHE/run"
say() { echo "==> bench-qemu: $*" >&2; }
t0=$SECONDS
trap 'vms_stop; storage_bridge_down' EXIT

# --- builds (the image build also builds static edgevold + edgevol) ---------------------------
"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need fio
say "building the image (static edgevold, edgevol)"
"$ROOT/image/build.sh" >"$run/image-sizes.txt"
cat "$run/image-sizes.txt" >&2
say "building edgevol-node, e2e-agent (static) and the host test"
cargo build -q --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-node -p edgevol-e2e --bins >&2
cargo test -q --locked -p edgevol-e2e --test bench_qemu --no-run >&2 2>/dev/null ||
    cargo test --locked -p edgevol-e2e --test bench_qemu --no-run >&2
BIN="$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release"
say "builds done in $((SECONDS - t0)) s"

# --- 1. data path -------------------------------------------------------------------------------
if ((do_data)); then
    say "data path: PKI on the host, two identical 1 GiB raw backing files"
    "$BIN/edgevol" pki init --dir "$run/pki" --san localhost --san 127.0.0.1 --san 10.0.2.15 \
        --san 192.168.77.1 >/dev/null
    "$BIN/edgevol" pki issue --dir "$run/pki" --role controller --name controller >/dev/null
    truncate -s 1G "$run/pool.img" "$run/nvmet.img"
    csi_port=$(free_port SOCK_STREAM) node_csi=$(free_port SOCK_STREAM) node_exec=$(free_port SOCK_STREAM)
    app_exec=$(free_port SOCK_STREAM)
    link_a=$(free_port SOCK_DGRAM) link_n=$(free_port SOCK_DGRAM)
    nqn=nqn.2014-08.org.nvmexpress:bench-nvmet
    # Budget of the whole fio matrix: 6 workloads x 2 passes x 2 targets x runs x (secs + ramp +
    # start-up), the fill of both targets, the appliance's idle sample and the VMs' boots, with
    # room for a slow shared machine.
    budget=$((6 * 2 * 2 * runs * (secs + 30) + profile * 6 * 2 * (secs + 90) + secs + 900))
    pfiles=()
    for f in ca.pem server.pem server.key; do pfiles+=(--file "$run/pki/$f:/etc/edgevol-pki/$f"); done
    if ((profile)); then
        apt_need linux-perf
        pfiles+=(--host-bin "$(command -v perf)")
    fi

    link_kind="UDP datagrams (no NIC offloads)"
    if ((tap)); then
        storage_bridge_up "evbench$$"
        link_kind="two taps on a bridge (checksum and segmentation offloads)"
    fi
    say "booting the appliance VM (edgevold + nvmet-tcp)"
    vm_track "$CACHE/run/bench-appliance.pid"
    "$ROOT/qemu/run-guest.sh" --name bench-appliance --pidfile "$CACHE/run/bench-appliance.pid" \
        --timeout 180 --lifetime "$((budget + 300))" --mem 1024 --smp 1 \
        --append "edgevol.nvmet_nqn=$nqn${busy_poll_us:+ edgevol.busy_poll_us=$busy_poll_us}" \
        --bin "$BIN/edgevold" --bin "$BIN/e2e-agent" "${pfiles[@]}" \
        --file "$ROOT/qemu/bench-appliance-guest.sh:/etc/edgevol-bench-appliance.sh" \
        --module virtio_pci --module virtio_net --module virtio_blk --module nvmet --module nvmet-tcp \
        --cmd 'sh /etc/edgevol-bench-appliance.sh' \
        --detach-on 'EDGEVOL-BENCH-APPLIANCE READY' --fail-marker 'EDGEVOL-BENCH-APPLIANCE FAILED' -- \
        -netdev "user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:$csi_port-:9500,hostfwd=tcp:127.0.0.1:$app_exec-:7001" \
        -device virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:01 \
        -netdev "$(link_netdev "$link_a:$link_n")" \
        -device virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:01,event_idx=off,rx_queue_size=1024 \
        -drive "file=$run/pool.img,if=none,id=pool,format=raw,cache=writeback" \
        -device virtio-blk-pci,drive=pool,serial=EVBENCHPOOL \
        -drive "file=$run/nvmet.img,if=none,id=other,format=raw,cache=writeback" \
        -device virtio-blk-pci,drive=other,serial=EVBENCHNVMET

    say "booting the node VM (fio)"
    vm_track "$CACHE/run/bench-node.pid"
    "$ROOT/qemu/node-vm.sh" --bench --name bench-node --bin-dir "$BIN" --link "$link_n:$link_a" \
        --csi-port "$node_csi" --exec-port "$node_exec" --timeout 240 --lifetime "$((budget + 300))"

    say "fio: $runs runs x ${secs} s per workload, pass (unpaced, paced) and target (budget ${budget} s)"
    EDGEVOL_E2E_CSI="127.0.0.1:$csi_port" EDGEVOL_E2E_PKI="$run/pki" \
        EDGEVOL_E2E_NODE_CSI="127.0.0.1:$node_csi" EDGEVOL_E2E_NODE_EXEC="127.0.0.1:$node_exec" \
        EDGEVOL_BENCH_NVMET="192.168.77.1:4421:$nqn" EDGEVOL_BENCH_OUT="$run/data-path.md" \
        EDGEVOL_BENCH_APPLIANCE_EXEC="127.0.0.1:$app_exec" \
        EDGEVOL_BENCH_SECS="$secs" EDGEVOL_BENCH_RUNS="$runs" EDGEVOL_BENCH_ONLY="$only" \
        EDGEVOL_BENCH_PROFILE="$profile" \
        timeout --kill-after=10 "$budget" cargo test -q --locked -p edgevol-e2e --test bench_qemu -- \
        --ignored --test-threads=1 --nocapture >&2 || { say "data path FAILED (per-run figures above)"; failed=1; }
    vms_stop
    storage_bridge_down
    rm -f "$run/pool.img" "$run/nvmet.img" # 512 MiB written between them
    echo "Data path in QEMU: fio in the node VM, medians of $runs interleaved runs of ${secs} s per target (TCG: compare the ratios); storage link: $link_kind"
    echo
    cat "$run/data-path.md" 2>/dev/null || echo "(no table: the fio matrix did not complete; see the log)"
    echo
fi

# --- 2. image sizes and boot-to-ready -------------------------------------------------------------
size_row() { printf '| %s | %s | %s MiB |\n' "$1" "$(stat -c %s "$2")" "$(awk -v b="$(stat -c %s "$2")" 'BEGIN { printf "%.2f", b / 1048576 }')"; }
{
    printf '| artifact | bytes | MiB |\n|---|---:|---:|\n'
    size_row "image/out/initramfs.gz" "$ROOT/image/out/initramfs.gz"
    size_row "image/out/vmlinuz" "$ROOT/image/out/vmlinuz"
    size_row "image/out/edgevol.img (raw disk)" "$ROOT/image/out/edgevol.img"
} >"$run/sizes.md"
if ((do_boot)); then
    say "boot-to-ready: one first boot, then 3 later boots of the image"
    cp "$ROOT/image/out/edgevol.img" "$run/boot-disk.img"
    truncate -s 256M "$run/boot-nvme.img"
    boots=()
    for i in 0 1 2 3; do
        vm_track "$CACHE/run/bench-boot.pid"
        "$ROOT/qemu/appliance-vm.sh" --name bench-boot --pidfile "$CACHE/run/bench-boot.pid" \
            --disk "$run/boot-disk.img" --nvme "$run/boot-nvme.img" --timeout 180 --lifetime 240 --stop
        sleep 1
        ms=$(grep -o 'READY boot_ms=[0-9]*' "$CACHE/logs/bench-boot.log" | head -1 | cut -d= -f2)
        [[ -n "$ms" ]] || { say "no boot_ms in the boot log"; exit 1; }
        if ((i == 0)); then first=$ms; else boots+=("$ms"); fi
        say "boot $i: boot_ms=$ms"
    done
    med=$(printf '%s\n' "${boots[@]}" | sort -n | sed -n 2p)
    printf '| QEMU image boot-to-ready (TCG, median of 3 later boots: %s ms) | %s ms | - |\n' "${boots[*]}" "$med" >>"$run/sizes.md"
    printf '| QEMU image first boot to ready (PKI + pool format) | %s ms | - |\n' "$first" >>"$run/sizes.md"
fi
echo "Image footprint"
echo
cat "$run/sizes.md"
say "done in $((SECONDS - t0)) s"
exit "$failed"
