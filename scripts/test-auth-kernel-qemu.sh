#!/usr/bin/env bash
# NVMe in-band authentication (DH-HMAC-CHAP, issue 15) as Linux does it on both ends: the
# reference the edgevol target is to be tested against. One QEMU TCG guest boots the pinned 6.12
# kernel (run-guest.sh --kernel auth: qemu/versions.env EDGEVOL_AUTH_KERNEL_*, built with
# CONFIG_NVME_AUTH, CONFIG_NVME_HOST_AUTH and CONFIG_NVME_TARGET_AUTH; the 6.1 kernel has none of
# them) with the modules nvme-tcp, nvmet and nvmet-tcp (and their dependencies; the hashes, HMAC
# and the RFC 7919 DH groups are built in), a virtio-rng device (nvme gen-dhchap-key needs the
# kernel's random pool ready) and Debian's nvme-cli copied from the host.
# qemu/auth-kernel-guest.sh configures the kernel's own target (nvmet-tcp on 127.0.0.1:4420)
# through configfs to require a host key and a controller key, makes the keys with
# `nvme gen-dhchap-key`, connects with `nvme connect --dhchap-secret --dhchap-ctrl-secret`, writes
# and reads 1 MiB through the namespace, and shows a connect without a key, with a wrong host key
# and with a wrong controller key refused. Prints each step's output and the kernel's messages.
# Takes about 30 s; a refused connect can add 60 s: the target ends the controller at once
# ("nvmet: ctrl 1 fatal error occurred!"), and an AUTH command the host still has on that queue
# may get no completion, so the host waits out its admin command timeout ("Fabrics Cmd QID 0
# timeout", "auth_send failed with status 880") before the connect fails.
# Installs what it needs (scripts/setup-qemu.sh, apt: nvme-cli). Exit 0 = PASS.
#
# usage: scripts/test-auth-kernel-qemu.sh [--hash HASH] [--dhgroup GROUP] [--matrix] [--timeout SECS]
#   --hash     the target's dhchap_hash: hmac(sha256) (default), hmac(sha384) or hmac(sha512)
#   --dhgroup  the target's dhchap_dhgroup: null, ffdhe2048 (default), ffdhe3072 ... ffdhe8192
#   --matrix   also connect once with each hash and each DH group
#   --timeout  the guest's budget (default 300; --matrix adds 900)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hash="hmac(sha256)" dhgroup=ffdhe2048 matrix=0 timeout=300
opts_parse 'hash dhgroup matrix! timeout' "$@"
((matrix)) && timeout=$((timeout + 900))

"$ROOT/scripts/setup-qemu.sh" >/dev/null
apt_need nvme-cli
t0=$SECONDS
rc=0
"$ROOT/qemu/run-guest.sh" --kernel auth --name auth-kernel --timeout "$timeout" --mem 512 \
    --host-bin /usr/sbin/nvme --file "$ROOT/qemu/auth-kernel-guest.sh:/etc/auth-kernel-guest.sh" \
    --module nvme-tcp --module nvmet --module nvmet-tcp --module virtio_rng \
    --append "edgevol.hash=$hash edgevol.dhgroup=$dhgroup edgevol.matrix=$matrix" \
    --cmd 'sh /etc/auth-kernel-guest.sh' --pass-marker 'EVAUTH PASS' -- -device virtio-rng-pci || rc=$?
# The guest's report: steps, kernel messages, verdicts (the boot's own messages left out).
sed -n '/EDGEVOL-GUEST-START/,/EDGEVOL-GUEST-EXIT/p' "$CACHE/logs/auth-kernel.log" | tr -d '\r'
log "auth kernel reference: rc=$rc in $((SECONDS - t0)) s (log: $CACHE/logs/auth-kernel.log)"
exit "$rc"
