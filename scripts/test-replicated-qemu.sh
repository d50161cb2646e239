#!/usr/bin/env bash
# Replicated volumes in QEMU (TCG): edgevold processes on this host (box-a, box-b: dev file pools),
# one site PKI made here, `edgevol proxy` in front, and a node VM (the pinned 6.1 kernel with
# raid1, Debian's mdadm and fio, static edgevol-node reaching the boxes through slirp at 10.0.2.2).
# tests/e2e/tests/replicated.rs then checks, for a `replicas: "2"` ext4 volume and a raw block
# one: fio --verify=crc32c writers survive box-a SIGKILLed and kept down 30 s, then box-b the
# same, without an I/O or verify error; the degraded condition while a box is down, and md's own
# view (md/degraded, the member faulty, writes still completing); a resync that wrote onto the
# returning leg no more than the bitmap's dirty chunks (the block layer's counters) once it is
# back; md's check finds the legs identical; online
# growth; a snapshot restored into a new replicated volume. Nothing is left.
# Then a power cut: box-c, the appliance firmware image VM (image/build.sh --pki with the site's
# PKI and a server certificate of its own, emulated NVMe drive, reached by the node over a
# `-netdev dgram` link) holds one leg of each of two new volumes, box-a the other; its QEMU is
# SIGKILLed under the same writers, kept off 30 s and booted again: the same checks.
# Logs: qemu/.cache/logs/replicated-*.log and qemu/.cache/replicated/*.log. Exit 0 = PASS.
#
# --bench instead runs the benchmark of the same set-up (on a quiet machine): fio rows on a plain
# and on a replicated volume, interleaved, and a leg's resync time; it prints a markdown table.
#
# usage: scripts/test-replicated-qemu.sh [--bench]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
bench=0
opts_parse 'bench!' "$@"
test_name=replicated_volumes_survive_the_loss_of_either_box
((bench)) && test_name=bench_replicated_against_single
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
say() { echo "==> replicated: $*" >&2; }
t0=$SECONDS

"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need mdadm fio util-linux e2fsprogs xfsprogs
run="$CACHE/replicated"
rm -rf "$run"
mkdir -p "$run" "$CACHE/logs" "$CACHE/run"

say "building edgevold, edgevol, static edgevol-node and e2e-agent, the host test"
CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}" \
    cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-node -p edgevol-e2e --bins >&2
cargo test -q --locked --workspace --no-run >&2
say "builds done in $((SECONDS - t0)) s"

# One CA and one controller certificate for both boxes, as an operator sets a site up.
"$CARGO_TARGET_DIR/debug/edgevol" pki init --dir "$run/pki" --san localhost --san 127.0.0.1 >/dev/null
"$CARGO_TARGET_DIR/debug/edgevol" pki issue --dir "$run/pki" --role controller --name controller >/dev/null
"$CARGO_TARGET_DIR/debug/edgevol" pki server --dir "$run/pki" --name box-c \
    --san localhost --san 127.0.0.1 --san 192.168.77.1 >/dev/null
if ((!bench)); then
    say "building the firmware image of box-c (the site's PKI on it)"
    "$ROOT/image/build.sh" --out "$run/image" --config "$ROOT/tests/e2e/edgevold-box-c.toml" \
        --pki "$run/pki" --pki-server box-c >/dev/null
    cp --sparse=always "$run/image/edgevol.img" "$run/box-c.img"
    truncate -s 1G "$run/box-c-nvme.img"
fi

node_csi=$(free_port SOCK_STREAM) node_exec=$(free_port SOCK_STREAM) box_c_csi=$(free_port SOCK_STREAM)
link_n=$(free_port SOCK_DGRAM) link_c=$(free_port SOCK_DGRAM)
trap vms_stop EXIT
vm_track "$CACHE/run/replicated-node.pid"
vm_track "$CACHE/run/replicated-box-c.pid"
say "booting the node VM"
# box-a and box-b are host processes, reached through slirp; the dgram link leads to box-c.
"$ROOT/qemu/node-vm.sh" --name replicated-node --bin-dir "$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release" \
    --link "$link_n:$link_c" --csi-port "$node_csi" --exec-port "$node_exec" \
    --appliance box-a,box-b,box-c --md --reach-host --timeout 150 --lifetime 1200

export EDGEVOL_E2E_BIN="$CARGO_TARGET_DIR/debug" EDGEVOL_E2E_PKI="$run/pki" EDGEVOL_E2E_WORK="$run" \
    EDGEVOL_E2E_NODE_CSI="127.0.0.1:$node_csi" EDGEVOL_E2E_NODE_EXEC="127.0.0.1:$node_exec"
# replicated_test BUDGET NAME: one test of tests/e2e/tests/replicated.rs.
replicated_test() {
    say "$2"
    timeout --kill-after=10 "$(scaled "$1")" cargo test --locked --workspace --test replicated -- \
        --ignored --exact "$2" --test-threads=1 --nocapture
}
replicated_test 900 "$test_name"
((bench)) && { say "PASS in $((SECONDS - t0)) s"; exit 0; }

# box-c: booted (and booted again after its power cut, by the test) with this command.
box_c_boot=("$ROOT/qemu/appliance-vm.sh" --name replicated-box-c --disk "$run/box-c.img"
    --nvme "$run/box-c-nvme.img" --csi-port "$box_c_csi" --link "$link_c:$link_n"
    --pidfile "$CACHE/run/replicated-box-c.pid" --timeout 240 --lifetime 900)
say "booting box-c (first boot: formats its drive)"
"${box_c_boot[@]}" >&2
export EDGEVOL_E2E_BOX_C_CSI="127.0.0.1:$box_c_csi" EDGEVOL_E2E_BOX_C_BOOT="${box_c_boot[*]}" \
    EDGEVOL_E2E_BOX_C_PIDFILE="$CACHE/run/replicated-box-c.pid"
replicated_test 900 a_replicated_volume_survives_a_power_cut_of_a_box
say "PASS in $((SECONDS - t0)) s"
