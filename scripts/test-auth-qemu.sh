#!/usr/bin/env bash
# DH-HMAC-CHAP (issue 15) against the real Linux initiator: a QEMU TCG guest booting the pinned
# 6.12 kernel (run-guest.sh --kernel auth: CONFIG_NVME_AUTH) with Debian's nvme-cli and fio
# connects through slirp to edgevold targets in the test process on the host, which require
# authentication (appliance/tests/nvme_auth_qemu.rs, qemu/nvme-auth-guest.sh): no key, a wrong
# host key, a wrong controller key and another node's pair are refused with nothing reaching the
# volume; the right pair (bidirectional) writes and reads back; a key rotation while fio writes
# and verifies (the new pair to the controller's sysfs dhchap_secret / dhchap_ctrl_secret, the
# kernel re-authenticates, the store keeps only the new pair, the old one is refused); every hash
# and DH group completes (one appliance per forced hash / group); and a table of connect times
# with and without authentication.
# Installs what it needs via scripts/setup-qemu.sh and apt (nvme-cli, fio). Exit 0 = PASS.
#
# usage: scripts/test-auth-qemu.sh [--runs N] [--timeout SECS]
#   --runs     connects per hash / DH group for the timing table (default 1; BENCHMARKS.md: 3)
#   --timeout  whole budget: build + boot + run (default 600, plus 180 per extra run)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
runs=1 timeout=""
opts_parse 'runs timeout' "$@"
timeout=${timeout:-$((600 + 180 * (runs - 1)))}
"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need nvme-cli fio
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export EDGEVOL_AUTH_QEMU_RUNS=$runs
cd "$ROOT"
exec timeout --kill-after=10 "$(scaled "$timeout")" \
    cargo test --locked --workspace --test nvme_auth_qemu -- --ignored --nocapture
