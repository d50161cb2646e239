#!/usr/bin/env bash
# The NVMe/TCP target against the real Linux initiator: a QEMU TCG guest (pinned Debian cloud
# kernel, nvme-tcp module, busybox) connects through slirp to edgevold's target running in the
# test process on the host, is refused with an unpublished host NQN, then writes 2 MiB with dd,
# reads it back after dropping its page cache, and the test checks the same bytes through core
# (appliance/tests/nvme_linux.rs). Then Debian's nvme-cli, copied from the host with its shared
# libraries into a second guest (with fio and mkfs.ext4), runs discover / connect / list /
# id-ctrl / id-ns, a dd round trip, fio --verify=crc32c, a CSI snapshot cut while fio writes
# (checked on a clone), ext4 files md5-verified over a new connection, and refused connects
# (appliance/tests/nvme_cli.rs, qemu/nvme-cli-guest.sh). A third guest checks per-volume QoS with
# fio: 300 IOPS held, raised live to 600 by ControllerModifyVolume, 5 MiB/s held, an unlimited
# neighbour unharmed (appliance/tests/qos_qemu.rs, qemu/qos-guest.sh).
# Installs what it needs via scripts/setup-qemu.sh and apt (nvme-cli, fio). Exit 0 = PASS.
#
# usage: scripts/test-nvme-qemu.sh [--timeout SECS]   (default 480: build + three boots + runs)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
timeout=480
opts_parse 'timeout' "$@"
"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need nvme-cli fio e2fsprogs
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
cd "$ROOT"
exec timeout --kill-after=10 "$(scaled "$timeout")" \
    cargo test --locked --workspace --test nvme_linux --test nvme_cli --test qos_qemu -- \
    --ignored --nocapture
