#!/usr/bin/env bash
# Install and cache everything the QEMU harness (qemu/run-guest.sh) needs. Idempotent: a second
# run only checks. Safe on a fresh clone (CI): installs Debian packages, the musl Rust target,
# and downloads + extracts the pinned Debian cloud kernel into qemu/.cache/ (gitignored).
#
# Output (stdout, last lines): the paths it prepared, e.g.
#   EDGEVOL_KERNEL=/…/qemu/.cache/kernel/6.1.0-48-cloud-amd64/boot/vmlinuz-6.1.0-48-cloud-amd64
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../qemu/versions.env
. "$ROOT/qemu/versions.env"
CACHE="${EDGEVOL_QEMU_CACHE:-$ROOT/qemu/.cache}"
KDIR="$CACHE/kernel/$EDGEVOL_KERNEL_RELEASE"
STAMP="$KDIR/.extracted-$EDGEVOL_KERNEL_VERSION"

log() { echo "setup-qemu: $*" >&2; }

need_apt=()
for p in $EDGEVOL_QEMU_APT_PACKAGES kmod; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        need_apt+=("$p")
    fi
done
if ((${#need_apt[@]})); then
    log "installing Debian packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if command -v rustup >/dev/null; then
    if ! rustup target list --installed | grep -qx "$EDGEVOL_GUEST_TARGET"; then
        log "adding Rust target $EDGEVOL_GUEST_TARGET"
        rustup target add "$EDGEVOL_GUEST_TARGET" >&2
    fi
else
    log "warning: rustup not found; guest binaries need the $EDGEVOL_GUEST_TARGET target"
fi

if [[ ! -f "$STAMP" ]]; then
    log "fetching $EDGEVOL_KERNEL_PKG=$EDGEVOL_KERNEL_VERSION"
    mkdir -p "$CACHE/debs"
    deb="$CACHE/debs/${EDGEVOL_KERNEL_PKG}_${EDGEVOL_KERNEL_VERSION}_amd64.deb"
    if [[ ! -s "$deb" ]]; then
        tmpd="$(mktemp -d "$CACHE/debs/dl.XXXXXX")"
        chmod 0755 "$tmpd" "$CACHE/debs"  # lets apt's _apt user write (no sandbox warning)
        if ! (cd "$tmpd" && apt-get download "$EDGEVOL_KERNEL_PKG=$EDGEVOL_KERNEL_VERSION" >&2); then
            # A stale package list may not know the pinned version yet.
            apt-get update -qq
            (cd "$tmpd" && apt-get download "$EDGEVOL_KERNEL_PKG=$EDGEVOL_KERNEL_VERSION" >&2)
        fi
        mv "$tmpd"/*.deb "$deb"
        rmdir "$tmpd"
    fi
    rm -rf "$KDIR"
    mkdir -p "$KDIR"
    dpkg-deb -x "$deb" "$KDIR"
    # The package ships no modules.dep (its postinst runs depmod): build it here so the harness
    # can resolve module dependencies.
    depmod -b "$KDIR" "$EDGEVOL_KERNEL_RELEASE"
    touch "$STAMP"
fi

for f in "$KDIR/boot/vmlinuz-$EDGEVOL_KERNEL_RELEASE" "$KDIR/lib/modules/$EDGEVOL_KERNEL_RELEASE/modules.dep" /usr/bin/qemu-system-x86_64 /bin/busybox; do
    [[ -e "$f" ]] || { log "missing after setup: $f"; exit 1; }
done
echo "EDGEVOL_KERNEL=$KDIR/boot/vmlinuz-$EDGEVOL_KERNEL_RELEASE"
echo "EDGEVOL_MODULES=$KDIR/lib/modules/$EDGEVOL_KERNEL_RELEASE"
