#!/usr/bin/env bash
# Install and cache everything the QEMU harness (qemu/run-guest.sh) needs. Idempotent: a second
# run only checks. Safe on a fresh clone (CI): installs Debian packages, the musl Rust target,
# and downloads + extracts the two pinned Debian cloud kernels (qemu/versions.env: the default
# one, and the one with NVMe in-band authentication for run-guest.sh --kernel auth) into
# qemu/.cache/ (gitignored).
#
# Output (stdout, last lines): the paths it prepared, e.g.
#   EDGEVOL_KERNEL=/…/qemu/.cache/kernel/6.1.0-48-cloud-amd64/boot/vmlinuz-6.1.0-48-cloud-amd64
#   EDGEVOL_AUTH_KERNEL=/…/qemu/.cache/kernel/6.12.117+deb12-cloud-amd64/boot/vmlinuz-6.12…
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# shellcheck disable=SC2086 # a list of package names
apt_need $EDGEVOL_QEMU_APT_PACKAGES kmod

if command -v rustup >/dev/null; then
    if ! rustup target list --installed | grep -qx "$EDGEVOL_GUEST_TARGET"; then
        log "adding Rust target $EDGEVOL_GUEST_TARGET"
        rustup target add "$EDGEVOL_GUEST_TARGET" >&2
    fi
else
    log "warning: rustup not found; guest binaries need the $EDGEVOL_GUEST_TARGET target"
fi

for f in /usr/bin/qemu-system-x86_64 /bin/busybox; do
    [[ -e "$f" ]] || { log "missing after setup: $f"; exit 1; }
done
for flavour in default auth; do
    kernel_fetch "$flavour"
    for f in "$KERNEL" "$MODDIR/modules.dep"; do
        [[ -e "$f" ]] || { log "missing after setup: $f"; exit 1; }
    done
    prefix=EDGEVOL
    [[ $flavour == auth ]] && prefix=EDGEVOL_AUTH
    echo "${prefix}_KERNEL=$KERNEL"
    echo "${prefix}_MODULES=$MODDIR"
done
