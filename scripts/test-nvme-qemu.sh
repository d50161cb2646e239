#!/usr/bin/env bash
# The NVMe/TCP target against the real Linux initiator: a QEMU TCG guest (pinned Debian cloud
# kernel, nvme-tcp module, busybox) connects through slirp to edgevold's target running in the
# test process on the host, is refused with an unpublished host NQN, then writes 2 MiB with dd,
# reads it back after dropping its page cache, and the test checks the same bytes through core.
# Installs what it needs via scripts/setup-qemu.sh. Exit 0 = PASS.
#
# usage: scripts/test-nvme-qemu.sh [--timeout SECS]   (default 240: build + boot + run)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
timeout_s=240
while (($#)); do
    case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
"$ROOT/scripts/setup-qemu.sh" >/dev/null
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
cd "$ROOT"
exec timeout --kill-after=10 "$timeout_s" \
    cargo test --locked -p edgevol-appliance --test nvme_linux -- --ignored --nocapture
