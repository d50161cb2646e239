#!/usr/bin/env bash
# Encrypted volumes in QEMU (TCG): an edgevold process on this host (box-e: a dev file pool the
# test reads), a site PKI made here, and a node VM (the pinned 6.1 kernel with dm-crypt and xts,
# Debian's cryptsetup, static edgevol-node reaching the box through slirp at 10.0.2.2).
# tests/e2e/tests/encrypted.rs then checks: an encrypted ext4 volume and an encrypted raw block
# volume written with a marker, unstaged, staged again and read back; the box's pool holds no
# copy of the marker (a plain volume's marker is found, so the scan works); a missing secret is
# INVALID_ARGUMENT, a wrong key FAILED_PRECONDITION; a rotation re-keys the slot and the old key
# stops opening the volume; expansion grows the mapping and ext4; a snapshot restored with the
# key reads the data; no passphrase in any log line, error or state file. Nothing is left.
# Logs: qemu/.cache/logs/encrypted-node.log and qemu/.cache/encrypted/box-e.log. Exit 0 = PASS.
#
# --bench instead runs the benchmark of the same set-up (on a quiet machine; the node VM also
# carries fio): a plain and an encrypted raw block volume, 4k randread/randwrite QD16 and 128k
# read/write QD8, interleaved, medians of --runs rounds of --secs each, with the node VM's CPU
# busy per volume; it prints a markdown table (also in qemu/.cache/encrypted/bench.md).
#
# usage: scripts/test-encrypted-qemu.sh [--bench [--runs 3] [--secs 10]]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
bench=0 runs=3 secs=10
opts_parse 'bench! runs secs' "$@"
test_name=encrypted_volumes_keep_the_box_blind
flavour=(--crypt)
if ((bench)); then
    test_name=bench_encrypted_against_plain
    flavour=(--crypt --md) # --md: fio (and 1 GiB of memory)
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
say() { echo "==> encrypted: $*" >&2; }
t0=$SECONDS

"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need cryptsetup-bin util-linux e2fsprogs xfsprogs python3
run="$CACHE/encrypted"
rm -rf "$run"
mkdir -p "$run" "$CACHE/logs" "$CACHE/run"

say "building edgevold, edgevol, static edgevol-node and e2e-agent, the host test"
CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}" \
    cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-node -p edgevol-e2e --bins >&2
cargo test -q --locked --workspace --no-run >&2
say "builds done in $((SECONDS - t0)) s"

"$CARGO_TARGET_DIR/debug/edgevol" pki init --dir "$run/pki" --san localhost --san 127.0.0.1 >/dev/null
"$CARGO_TARGET_DIR/debug/edgevol" pki issue --dir "$run/pki" --role controller --name controller >/dev/null

node_csi=$(free_port SOCK_STREAM) node_exec=$(free_port SOCK_STREAM)
link_n=$(free_port SOCK_DGRAM) link_x=$(free_port SOCK_DGRAM)
trap vms_stop EXIT
vm_track "$CACHE/run/encrypted-node.pid"
say "booting the node VM"
# The box is a host process reached through slirp; the dgram link leads nowhere.
"$ROOT/qemu/node-vm.sh" --name encrypted-node --bin-dir "$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release" \
    --link "$link_n:$link_x" --csi-port "$node_csi" --exec-port "$node_exec" \
    --appliance box-e "${flavour[@]}" --reach-host --timeout 150 --lifetime 1200

export EDGEVOL_E2E_BIN="$CARGO_TARGET_DIR/debug" EDGEVOL_E2E_PKI="$run/pki" EDGEVOL_E2E_WORK="$run" \
    EDGEVOL_E2E_NODE_CSI="127.0.0.1:$node_csi" EDGEVOL_E2E_NODE_EXEC="127.0.0.1:$node_exec" \
    EDGEVOL_E2E_NODE_LOG="$CACHE/logs/encrypted-node.log" \
    EDGEVOL_BENCH_RUNS="$runs" EDGEVOL_BENCH_SECS="$secs" EDGEVOL_BENCH_OUT="$run/bench.md"
say "$test_name"
budget=900
((bench)) && budget=$((1800 + runs * secs * 8 * 3))
timeout --kill-after=10 "$(scaled "$budget")" cargo test --locked --workspace --test encrypted -- \
    --ignored --exact "$test_name" --test-threads=1 --nocapture
say "PASS in $((SECONDS - t0)) s"
