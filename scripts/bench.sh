#!/usr/bin/env bash
# One benchmark command: control plane over mTLS, core, hal (raw-device baseline), the data path
# (appliance/benches/data_path.rs), a DH-HMAC-CHAP transaction per DH group (nvmeof/benches/auth.rs),
# and footprint (daemon RSS at 0 / 1,000 / 10,000
# volumes, static binary size, firmware image size), and in full mode the data path in QEMU (fio in
# a node VM: edgevol vs the kernel's nvmet-tcp) with the image's boot-to-ready (scripts/bench-qemu.sh).
# Prints every table and writes them as JSON
# to target/bench/results.json. Every bench prints its own baseline from the same run; this
# script only collects. It asserts no timings: a bench fails only if it cannot run.
#
# usage: scripts/bench.sh [--quick]
#   --quick  CI smoke mode: small counts, short runs, built with the test (dev) profile so it
#            reuses the test build and no release build happens; its figures are not
#            meaningful, it only proves every bench still runs.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

quick=0
case "${1:-}" in
    --quick) quick=1 ;;
    "") ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac
qarg=()
profile=(--release)
bench_profile=()
if ((quick)); then
    qarg=(--quick)
    profile=()
    bench_profile=(--profile dev)
fi

target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
out="$ROOT/target/bench"
mkdir -p "$out"
json="$out/results.json"
sections=()

# JSON string of $1.
jstr() {
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\t'/ }
    printf '"%s"' "$s"
}

# Appends a section: name, the command, its markdown table (file); rows become arrays of cells.
section() {
    local name=$1 cmd=$2 file=$3 rows=() line cells c first
    while IFS= read -r line; do
        [[ $line == \|* ]] || continue
        [[ $line =~ ^\|[-:\ \|]+\|$ ]] && continue
        line=${line#|}
        line=${line%|}
        cells="["
        first=1
        IFS='|' read -ra parts <<<"$line"
        for c in "${parts[@]}"; do
            c="${c#"${c%%[![:space:]]*}"}"
            c="${c%"${c##*[![:space:]]}"}"
            ((first)) || cells+=","
            first=0
            cells+=$(jstr "$c")
        done
        rows+=("$cells]")
    done <"$file"
    local joined
    joined=$(IFS=,; echo "${rows[*]-}")
    sections+=("{\"name\":$(jstr "$name"),\"command\":$(jstr "$cmd"),\"rows\":[${joined}]}")
}

# Runs a bench command, shows its output, keeps its tables.
run() {
    local name=$1
    shift
    local file="$out/${name// /_}.md"
    log "$name: $*"
    "$@" | tee "$file"
    section "$name" "$*" "$file"
}

run "control plane" cargo bench -q "${bench_profile[@]}" -p edgevol-appliance --bench control_plane -- "${qarg[@]}"
run "footprint RSS" cargo bench -q "${bench_profile[@]}" -p edgevol-appliance --bench footprint -- "${qarg[@]}"

if ((quick)); then
    # core_bench has no short mode (10,000-volume open, 1 TiB snapshot): build it so it cannot
    # rot, run it in the full mode only.
    log "core: build only in --quick"
    cargo bench -q "${bench_profile[@]}" -p edgevol-core --bench core_bench --no-run
    printf '| measurement | edgevol-core | baseline | ratio |\n|---|---|---|---|\n| skipped in --quick (built only) | - | - | - |\n' >"$out/core.md"
    section "core" "cargo bench -p edgevol-core --bench core_bench --no-run" "$out/core.md"
else
    run "core" cargo bench -q -p edgevol-core --bench core_bench
fi

# hal-bench on a file in tmpfs (the host half of hal/BENCHMARKS.md; the emulated NVMe half is
# scripts/test-hal-qemu.sh --bench).
hal_file="/dev/shm/edgevol-bench-$$.img"
[[ -d /dev/shm ]] || hal_file="$out/hal-bench.img"
if ((quick)); then hal_args=(--size-mib 64 --secs 0.05); else hal_args=(--size-mib 256 --secs 1); fi
run "hal" cargo run -q "${profile[@]}" -p edgevol-hal-tools --bin hal-bench -- "$hal_file" "${hal_args[@]}"
rm -f "$hal_file"

run "data path" cargo bench -q "${bench_profile[@]}" -p edgevol-appliance --bench data_path -- "${qarg[@]}"
run "QoS" cargo bench -q "${bench_profile[@]}" -p edgevol-appliance --bench qos -- "${qarg[@]}"
run "DH-HMAC-CHAP transaction (target side)" cargo bench -q "${bench_profile[@]}" -p edgevol-nvmeof \
    --features test-initiator --bench auth -- "${qarg[@]}"
run "snapshot metadata" cargo bench -q "${bench_profile[@]}" -p edgevol-appliance --bench snapshot_metadata \
    -- "${qarg[@]}"

# Data path in QEMU and the image's boot-to-ready (scripts/bench-qemu.sh: two TCG VMs, fio, minutes
# of runtime): full mode only. A failure there is reported and does not stop the other benches.
qemu_md="$out/data_path_qemu.md"
rm -f "$qemu_md"
if ((quick)); then
    log "data path in QEMU + image boot-to-ready: skipped in --quick (full mode runs scripts/bench-qemu.sh)"
elif ! run "data path qemu" "$ROOT/scripts/bench-qemu.sh"; then
    log "data path in QEMU: scripts/bench-qemu.sh FAILED (logs in qemu/.cache/logs/bench-*.log); continuing"
fi

# Footprint: binary and image sizes (the image is built by scripts/bench-qemu.sh in full mode).
size_row() { # label, path
    if [[ -f $2 ]]; then
        local b
        b=$(stat -c %s "$2")
        printf '| %s | %s | %s MiB |\n' "$1" "$b" "$(awk -v b="$b" 'BEGIN { printf "%.2f", b / 1048576 }')"
    else
        printf '| %s | not built | - |\n' "$1"
    fi
}
sizes="$out/sizes.md"
{
    printf '| artifact | bytes | MiB |\n|---|---:|---:|\n'
    if ((quick)); then
        printf '| edgevold binaries | skipped in --quick (no release build) | - |\n'
    else
        cargo build -q --release -p edgevol-appliance --bin edgevold
        size_row "edgevold (release, glibc, dynamic)" "$target_dir/release/edgevold"
        command -v musl-gcc >/dev/null && export CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}"
        cargo build -q --release --target x86_64-unknown-linux-musl -p edgevol-appliance --bin edgevold >&2
        size_row "edgevold (static musl)" "$target_dir/x86_64-unknown-linux-musl/release/edgevold"
    fi
    size_row "image/out/initramfs.gz" "$ROOT/image/out/initramfs.gz"
    size_row "image/out/edgevol.img (raw disk)" "$ROOT/image/out/edgevol.img"
    if ((quick)); then
        printf '| QEMU image boot-to-ready | skipped in --quick (scripts/bench-qemu.sh) | - |\n'
    elif [[ -f $qemu_md ]] && grep -q '^| QEMU image' "$qemu_md"; then
        grep '^| QEMU image' "$qemu_md"
    else
        printf '| QEMU image boot-to-ready | not measured (scripts/bench-qemu.sh failed) | - |\n'
    fi
} | tee "$sizes"
section "footprint sizes" "cargo build --release [--target x86_64-unknown-linux-musl] -p edgevol-appliance; stat" "$sizes"

{
    printf '{"quick":%s,"date":%s,"host":{"cpus":%s,"cpu":%s,"kernel":%s},"sections":[' \
        "$([[ $quick == 1 ]] && echo true || echo false)" \
        "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" \
        "$(nproc)" \
        "$(jstr "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')")" \
        "$(jstr "$(uname -r)")"
    (IFS=,; printf '%s' "${sections[*]}")
    printf ']}\n'
} >"$json"
log "results: $json"
