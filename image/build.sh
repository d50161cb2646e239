#!/usr/bin/env bash
# Build the edgevol appliance firmware image, in one command:
#   image/out/vmlinuz        the pinned Debian 6.12 cloud kernel (qemu/versions.env, chosen by
#                            EDGEVOL_IMAGE_KERNEL in image/versions.env)
#   image/out/initramfs.gz   busybox (pinned busybox-static .deb), static musl edgevold + edgevol
#                            (for `edgevol pki` on first boot), virtio, vfat and watchdog modules,
#                            image/init and the guest helpers it sources (qemu/guest-lib.sh)
#   image/out/edgevol.bundle the same kernel + initramfs as a signed firmware update bundle
#   image/out/edgevol.img    raw disk, MBR: p1 FAT "EDGEVOLBOOT" (A/B slots /slot-a and /slot-b,
#                            this build in slot A; BIOS: syslinux from the pinned syslinux-common
#                            .deb, syslinux.cfg + its boot-once ADV; UEFI: GRUB EFI from the pinned
#                            grub-efi-amd64-bin .deb as /EFI/BOOT/BOOTX64.EFI, grub.cfg + grubenv),
#                            p2 ext4 "EDGEVOL-PERSIST" (edgevold.toml, network.conf; PKI and
#                            daemon state are added by the first boot)
# No root, no loop devices: partitions are built as files (mkfs.fat + mtools, mkfs.ext4 -d) and
# copied into the disk at their offsets; `syslinux --offset` installs the boot loader in place.
#
# usage: image/build.sh [--out DIR] [--config FILE] [--network FILE] [--pki DIR [--pki-server NAME]]
#                       [--version V] [--signing-dir D]
#   --config/--network replace image/defaults/{edgevold.toml,network.conf} on the persistent
#   partition. --pki: the site's PKI directory (`edgevol pki init`, `edgevol pki server`): its
#   ca.pem and the server pair NAME.pem/.key (--pki-server, default server) go to the persistent
#   partition as /pki/{ca.pem,server.pem,server.key}, and the box keeps them instead of making a
#   CA of its own on first boot (a site of several boxes shares one CA; the CA key stays off it). --version: the firmware version (default: workspace version + git commit).
#   --signing-dir: holds firmware-signing.key and .pub (`edgevol pki firmware-key`); the public
#   key is baked into the initramfs, the private one signs the bundle (default: a development key
#   made once in the QEMU cache). Prints the artifact sizes. Needs: scripts/setup-qemu.sh
#   (kernel), apt packages from image/versions.env (installed when missing).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

out="$ROOT/image/out" config="$ROOT/image/defaults/edgevold.toml" network="$ROOT/image/defaults/network.conf"
version="" signing_dir="$CACHE/firmware-dev-key" pki="" pki_server=server
opts_parse 'out config network pki pki-server version signing-dir' "$@"
if [[ -z "$version" ]]; then
    version="$(awk -F'"' '/^version = /{ print $2; exit }' "$ROOT/Cargo.toml")"
    version+="-g$(git -C "$ROOT" rev-parse --short=10 HEAD 2>/dev/null || echo unknown)"
fi
t0=$SECONDS
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
# The whole build: the packages it unpacks, the signing key it may create and the binaries it
# copies are shared with the QEMU steps beside it.
guest_build_lock
"$ROOT/scripts/setup-qemu.sh" >/dev/null
# shellcheck disable=SC2086 # a list of package names
apt_need $EDGEVOL_IMAGE_APT_PACKAGES
kernel_select "$EDGEVOL_IMAGE_KERNEL"

# --- pinned Debian packages, unpacked once ------------------------------------------------------
debs="$CACHE/image-debs"
for spec in $EDGEVOL_IMAGE_DEBS; do
    deb_unpack "${spec%%=*}" "${spec#*=}" "$debs/${spec%%=*}"
done
BUSYBOX="$debs/busybox-static/bin/busybox"
SYSLINUX_DIR="$debs/syslinux-common/usr/lib/syslinux"
GRUB_EFI_DIR="$debs/grub-efi-amd64-bin/usr/lib/grub/x86_64-efi"
[[ -x "$BUSYBOX" && -f "$SYSLINUX_DIR/mbr/mbr.bin" && -f "$SYSLINUX_DIR/modules/bios/ldlinux.c32" &&
    -f "$GRUB_EFI_DIR/loadenv.mod" ]] ||
    { echo "build.sh: pinned packages lack busybox, syslinux or GRUB EFI files" >&2; exit 1; }

# --- static daemon + CLI (ring's C code needs musl-gcc) -----------------------------------------
export CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}"
log "cargo build (static, $EDGEVOL_GUEST_TARGET): edgevold, edgevol"
cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-appliance -p edgevol-cli >&2
BIN="$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release"
for b in edgevold edgevol; do
    file "$BIN/$b" | grep -q 'statically linked\|static-pie linked' ||
        { echo "build.sh: $BIN/$b is not static" >&2; exit 1; }
done

# --- firmware signing key: the public half goes into the image ----------------------------------
if [[ ! -f "$signing_dir/firmware-signing.key" ]]; then
    log "no firmware signing key in $signing_dir: creating one"
    "$BIN/edgevol" pki firmware-key --dir "$signing_dir" >&2
fi
[[ -f "$signing_dir/firmware-signing.pub" ]] ||
    { echo "build.sh: $signing_dir/firmware-signing.pub missing" >&2; exit 1; }

# --- initramfs -----------------------------------------------------------------------------------
mkdir -p "$out"
work="$(mktemp -d "$out/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,sbin,etc/edgevol,proc,sys,dev,tmp,run,persist,boot,lib/modules,lib/edgevol,usr/bin,usr/sbin}
install -m 0755 "$BUSYBOX" "$rootfs/bin/busybox"
install -m 0755 "$BIN/edgevold" "$BIN/edgevol" "$rootfs/bin/"
install -m 0755 "$ROOT/image/init" "$rootfs/init"
install -m 0644 "$ROOT/qemu/guest-lib.sh" "$rootfs/lib/edgevol/guest-lib.sh"
install -m 0644 "$signing_dir/firmware-signing.pub" "$rootfs/etc/edgevol/firmware-signing.pub"
echo "$version" >"$rootfs/etc/edgevol/firmware-version"
# The cloud kernel has NVMe PCI, ext4 and TCP built in; virtio disk and NIC are modules, and so
# is vfat (the boot partition, where the A/B slots live). i6300esb: the hardware watchdog
# (/dev/watchdog) when the box has one; loaded at boot, it binds only if the device exists.
modules_install "$MODDIR" "$rootfs" virtio_pci virtio_blk virtio_net vfat nls_cp437 nls_ascii i6300esb ||
    exit 1
# softdog, the fallback: image/init loads it only when no hardware watchdog gave /dev/watchdog
# (a kernel timer: it catches a hung daemon, not a hung kernel). Its one dependency, the watchdog
# core, is in the list above already.
modules_install "$MODDIR" "$work/fallback" softdog || exit 1
if [[ "$(cat "$work/fallback/lib/modules/load.list")" != $'watchdog.ko\nsoftdog.ko' ]] ||
    ! grep -qx watchdog.ko "$rootfs/lib/modules/load.list"; then
    echo "build.sh: softdog needs more than the watchdog core: $(cat "$work/fallback/lib/modules/load.list")" >&2
    exit 1
fi
mkdir -p "$rootfs/lib/modules/fallback"
install -m 0644 "$work/fallback/lib/modules/softdog.ko" "$rootfs/lib/modules/fallback/"
(cd "$rootfs" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
    gzip -9 -n >"$out/initramfs.gz"
cp "$KERNEL" "$out/vmlinuz"

# --- the signed update bundle of this very kernel + initramfs ----------------------------------
"$BIN/edgevol" pki sign-firmware --key "$signing_dir/firmware-signing.key" --kernel "$out/vmlinuz" \
    --initramfs "$out/initramfs.gz" --version "$version" --out "$out/edgevol.bundle" >&2

# --- boot partition: FAT; slot A = this build, slot B empty; syslinux (BIOS) + GRUB (UEFI) -------
boot="$work/boot.fat"
truncate -s "${EDGEVOL_BOOT_MIB}M" "$boot"
mkfs.fat -F 16 -n EDGEVOLBOOT "$boot" >/dev/null
# grub.cfg, grubenv (UEFI) and syslinux.cfg (BIOS) of the factory state: slot A, no trial.
"$BIN/edgevol" firmware boot-files --out "$work/bootfiles" >/dev/null
cat >"$work/early.cfg" <<'CFG'
search --no-floppy --label EDGEVOLBOOT --set root
configfile ($root)/grub.cfg
CFG
# shellcheck disable=SC2086 # a list of module names
grub-mkimage -O x86_64-efi -d "$GRUB_EFI_DIR" -c "$work/early.cfg" -p /EFI/BOOT \
    -o "$work/BOOTX64.EFI" $EDGEVOL_GRUB_EFI_MODULES
export MTOOLS_SKIP_CHECK=1
mmd -i "$boot" ::/slot-a ::/slot-b ::/EFI ::/EFI/BOOT
mcopy -i "$boot" "$out/vmlinuz" "$out/initramfs.gz" ::/slot-a/
mcopy -i "$boot" "$work/bootfiles/grub.cfg" "$work/bootfiles/grubenv" "$work/bootfiles/syslinux.cfg" ::/
mcopy -i "$boot" "$work/BOOTX64.EFI" ::/EFI/BOOT/
mcopy -i "$boot" "$SYSLINUX_DIR/modules/bios/ldlinux.c32" ::/

# --- persistent partition: ext4 with the defaults ------------------------------------------------
persist="$work/persist.ext4"
mkdir -p "$work/persist"
install -m 0644 "$config" "$work/persist/edgevold.toml"
install -m 0644 "$network" "$work/persist/network.conf"
if [[ -n "$pki" ]]; then
    for f in ca.pem "$pki_server.pem" "$pki_server.key"; do
        [[ -f "$pki/$f" ]] || { echo "build.sh: --pki: no $pki/$f" >&2; exit 1; }
    done
    install -d -m 0700 "$work/persist/pki"
    install -m 0644 "$pki/ca.pem" "$work/persist/pki/ca.pem"
    install -m 0644 "$pki/$pki_server.pem" "$work/persist/pki/server.pem"
    install -m 0600 "$pki/$pki_server.key" "$work/persist/pki/server.key"
fi
truncate -s "${EDGEVOL_PERSIST_MIB}M" "$persist"
mkfs.ext4 -q -F -L EDGEVOL-PERSIST -E root_owner=0:0 -d "$work/persist" "$persist"

# --- the disk: MBR, p1 boot (active) at 1 MiB, p2 persist ----------------------------------------
img="$work/edgevol.img"
total=$((1 + EDGEVOL_BOOT_MIB + EDGEVOL_PERSIST_MIB))
truncate -s "${total}M" "$img"
sfdisk -q "$img" <<PARTS
label: dos
start=1MiB, size=${EDGEVOL_BOOT_MIB}MiB, type=6, bootable
start=$((1 + EDGEVOL_BOOT_MIB))MiB, size=${EDGEVOL_PERSIST_MIB}MiB, type=83
PARTS
dd if="$boot" of="$img" bs=1M seek=1 conv=notrunc status=none
dd if="$persist" of="$img" bs=1M seek=$((1 + EDGEVOL_BOOT_MIB)) conv=notrunc status=none
# syslinux's FAT installer through mtools, on the partition inside the disk image.
syslinux --install --offset $((1 << 20)) "$img"
dd if="$SYSLINUX_DIR/mbr/mbr.bin" of="$img" bs=440 count=1 conv=notrunc status=none
mv "$img" "$out/edgevol.img"

size() { stat -c %s "$1"; }
log "image built in $((SECONDS - t0)) s"
printf '%-26s %10s bytes\n' \
    "edgevold (static musl)" "$(size "$BIN/edgevold")" \
    "edgevol (static musl)" "$(size "$BIN/edgevol")" \
    "vmlinuz" "$(size "$out/vmlinuz")" \
    "initramfs.gz" "$(size "$out/initramfs.gz")" \
    "edgevol.bundle (signed)" "$(size "$out/edgevol.bundle")" \
    "BOOTX64.EFI (GRUB)" "$(size "$work/BOOTX64.EFI")" \
    "edgevol.img (raw disk)" "$(size "$out/edgevol.img")"
echo "EDGEVOL_IMAGE=$out/edgevol.img"
echo "EDGEVOL_BUNDLE=$out/edgevol.bundle"
echo "EDGEVOL_FIRMWARE_VERSION=$version"
