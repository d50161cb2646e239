#!/usr/bin/env bash
# Build the container images of edgevol offline, from the static (musl) binaries, with umoci:
# no base image is pulled and no daemon runs.
#   OUT/edgevol-VERSION.oci.tar       edgevol (CLI and `edgevol proxy`), nothing else
#   OUT/edgevol-node-VERSION.oci.tar  edgevol-node and exactly the host tools it runs (mount,
#                                     umount, blkid, fsck, mkfs.ext4/e2fsck/resize2fs,
#                                     mkfs.xfs/xfs_growfs, modprobe for nvme-fabrics/nvme-tcp,
#                                     mdadm for mirrored volumes, cryptsetup for encrypted
#                                     ones) with their shared libraries,
#                                     copied from this Debian system (versions in the image's
#                                     /usr/share/edgevol/host-tools.txt and its labels)
#   OUT/edgevol-swarm-plugin-VERSION.tar.gz  a Docker managed plugin directory (config.json +
#                                     rootfs: the node image, edgevol, busybox, the entrypoint
#                                     deploy/swarm/edgevol-swarm-plugin)
# Installs what it builds with: the Debian packages (umoci, musl-tools, the host tools) and Rust
# with the static target (rustup target add). Each is an OCI image layout in a tar (an OCI archive: `podman load -i`, `ctr images import`,
# `skopeo copy oci-archive:…`), named as deploy/images.env says, tagged with the workspace
# version and labelled org.opencontainers.image.{version,revision,source,title}. Prints the
# archives' sizes.
#
# Usage: scripts/build-images.sh [--out DIR]   (default DIR: image/out/oci)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/images.env
. "$ROOT/deploy/images.env"

out="$ROOT/image/out/oci"
opts_parse 'out' "$@"
((EUID == 0)) || die "needs root (umoci unpacks and repacks files owned by root)"
# The host tools copied into the node image come from these packages (kmod: modprobe).
HOST_TOOL_PACKAGES=(e2fsprogs xfsprogs mount util-linux kmod mdadm cryptsetup-bin)
apt_need umoci musl-tools file python3 "${HOST_TOOL_PACKAGES[@]}"
rust_setup
command -v rustup >/dev/null || die "rustup not found: the $EDGEVOL_GUEST_TARGET target cannot be added"
if ! rustup target list --installed | grep -qx "$EDGEVOL_GUEST_TARGET"; then
    log "adding Rust target $EDGEVOL_GUEST_TARGET"
    rustup target add "$EDGEVOL_GUEST_TARGET" >&2
fi

VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml")"
REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || REVISION="$REVISION-dirty"
[[ -n "$VERSION" ]] || die "no workspace version in Cargo.toml"

# --- static binaries -------------------------------------------------------------------------------
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}"
guest_build_lock # until exit: the binaries are copied below (lib.sh says why)
log "cargo build (static, $EDGEVOL_GUEST_TARGET): edgevol, edgevol-node"
# The same package sets as image/build.sh and scripts/test-e2e-qemu.sh build, so that after them
# (scripts/test.sh) these are cache hits: features unify per set, and another set would rebuild.
cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-appliance -p edgevol-cli >&2
cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET" -p edgevol-node -p edgevol-e2e --bins >&2
BIN="$CARGO_TARGET_DIR/$EDGEVOL_GUEST_TARGET/release"
for b in edgevol edgevol-node; do
    file "$BIN/$b" | grep -q 'statically linked\|static-pie linked' || die "$BIN/$b is not static"
done

mkdir -p "$out"
work="$(mktemp -d "$out/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A root filesystem skeleton, usr-merged like Debian's (so copied paths resolve the same).
skeleton() {
    local r=$1
    mkdir -p "$r"/usr/{bin,sbin,lib,lib64} "$r"/{etc,proc,sys,dev,run,csi} "$r/tmp"
    chmod 1777 "$r/tmp"
    ln -s usr/bin "$r/bin"
    ln -s usr/sbin "$r/sbin"
    ln -s usr/lib "$r/lib"
    ln -s usr/lib64 "$r/lib64"
}

# copy_tool ROOTFS PROGRAM: the program (symlinks resolved) at the path it has here, and every
# shared library it loads (ldd), each at its path here.
copy_tool() {
    local r=$1 path lib
    path="$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v "$2")" || die "$2 is not installed"
    mkdir -p "$r$(dirname "$path")"
    cp -L "$path" "$r$path"
    while read -r lib; do
        [[ -e "$r$lib" ]] && continue
        mkdir -p "$r$(dirname "$lib")"
        cp -L "$lib" "$r$lib"
    done < <(ldd "$path" | awk '/=> \// { print $3 } /^\t\/[^ ]+ \(/ { print $1 }')
}

# make_image NAME ROOTFS ENTRYPOINT: OUT/NAME-VERSION.oci.tar from ROOTFS (one layer).
make_image() {
    local name=$1 rootfs=$2 entry=$3 layout="$work/layout-$1" bundle="$work/bundle-$1"
    local ref="${name}:${VERSION}" image extra=()
    [[ -z "$HOST_TOOLS" ]] || extra=(--config.label "io.edgevol.host-tools=$HOST_TOOLS")
    umoci init --layout "$layout" >&2
    umoci new --image "$layout:$VERSION" >&2
    umoci unpack --image "$layout:$VERSION" "$bundle" >&2
    cp -a "$rootfs/." "$bundle/rootfs/"
    umoci repack --image "$layout:$VERSION" "$bundle" >&2
    umoci config --image "$layout:$VERSION" --os linux --architecture amd64 \
        --config.entrypoint "$entry" --config.workingdir / \
        --config.env PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        --config.label "org.opencontainers.image.title=$(basename "$name")" \
        --config.label "org.opencontainers.image.version=$VERSION" \
        --config.label "org.opencontainers.image.revision=$REVISION" \
        --config.label "org.opencontainers.image.source=$(sed -n 's/^repository = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml")" \
        --config.label "org.opencontainers.image.licenses=Apache-2.0" "${extra[@]}" >&2
    umoci gc --layout "$layout" >&2
    # The full name for importers that read it (containerd), beside the OCI tag.
    python3 - "$layout/index.json" "$ref" <<'PY'
import json, sys
path, ref = sys.argv[1:]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
json.dump(index, open(path, "w"))
PY
    image="$out/$(basename "$name")-$VERSION.oci.tar"
    tar --sort=name --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$image.new" .
    mv "$image.new" "$image"
    echo "$image"
}

size() { du -b "$1" | awk '{ printf "%.1f MiB", $1 / 1048576 }'; }

# --- edgevol (CLI, proxy) ------------------------------------------------------------------------
cli="$work/rootfs-cli"
skeleton "$cli"
install -m 0755 "$BIN/edgevol" "$cli/usr/bin/edgevol"
HOST_TOOLS=""
cli_image="$(make_image "$EDGEVOL_IMAGE_CLI" "$cli" /usr/bin/edgevol)"

# --- edgevol-node --------------------------------------------------------------------------------
node="$work/rootfs-node"
skeleton "$node"
install -m 0755 "$BIN/edgevol-node" "$node/usr/bin/edgevol-node"
for t in mount umount blkid fsck mkfs.ext4 e2fsck fsck.ext4 resize2fs mkfs.xfs xfs_growfs \
    modprobe mdadm cryptsetup; do
    copy_tool "$node" "$t"
done
cp /etc/mke2fs.conf "$node/etc/mke2fs.conf"
ln -s ../proc/self/mounts "$node/etc/mtab"
# /lib/modules (= /usr/lib/modules): where the host's modules are mounted for modprobe.
# /run/cryptsetup: cryptsetup's lock directory (it takes a lock per device while it works).
mkdir -p "$node/usr/share/edgevol" "$node/etc/nvme" "$node/var/lib/edgevol-node" "$node/usr/lib/modules" \
    "$node/run/cryptsetup"
dpkg-query -W -f='${Package}=${Version}\n' "${HOST_TOOL_PACKAGES[@]}" libc6 \
    >"$node/usr/share/edgevol/host-tools.txt"
HOST_TOOLS="$(paste -sd' ' "$node/usr/share/edgevol/host-tools.txt")"
node_image="$(make_image "$EDGEVOL_IMAGE_NODE" "$node" /usr/bin/edgevol-node)"

# --- Docker Swarm managed plugin: config.json + rootfs (docker plugin create NAME DIR) ----------
# The node image's files, edgevol for the proxy, busybox (the pinned .deb of the firmware image)
# for the entrypoint that starts both.
plugin="$work/edgevol-swarm-plugin"
mkdir -p "$plugin"
cp -a "$node" "$plugin/rootfs"
install -m 0755 "$BIN/edgevol" "$plugin/rootfs/usr/bin/edgevol"
for spec in $EDGEVOL_IMAGE_DEBS; do
    [[ ${spec%%=*} == busybox-static ]] && deb_unpack busybox-static "${spec#*=}" "$CACHE/image-debs/busybox-static"
done
install -m 0755 "$CACHE/image-debs/busybox-static/bin/busybox" "$plugin/rootfs/usr/bin/busybox"
install -m 0755 "$ROOT/deploy/swarm/edgevol-swarm-plugin" "$plugin/rootfs/usr/bin/edgevol-swarm-plugin"
install -m 0644 "$ROOT/deploy/swarm/config.json" "$plugin/config.json"
plugin_tar="$out/edgevol-swarm-plugin-$VERSION.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$work" -czf "$plugin_tar.new" edgevol-swarm-plugin
mv "$plugin_tar.new" "$plugin_tar"

log "images (revision $REVISION):"
for f in "$cli_image" "$node_image" "$plugin_tar"; do
    printf '  %-48s %s\n' "$(basename "$f")" "$(size "$f")" >&2
done
echo "$cli_image"
echo "$node_image"
echo "$plugin_tar"
