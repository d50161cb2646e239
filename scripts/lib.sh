# Shared helpers of the project scripts (sourced, never run): logging, options, Debian packages,
# the Rust toolchain, and the host side of the QEMU harness (pinned kernels and .debs, kernel
# modules for an initramfs, VM links, ports and pidfiles, the firmware's persistent partition).
# What runs inside the guests is qemu/guest-lib.sh.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Pinned inputs: the harness (kernel, host packages, guest target) and the firmware image.
# shellcheck source=qemu/versions.env
. "$ROOT/qemu/versions.env"
# shellcheck source=image/versions.env
. "$ROOT/image/versions.env"
CACHE="${EDGEVOL_QEMU_CACHE:-$ROOT/qemu/.cache}"
PROG="$(basename "$0" .sh)"

log() { echo "==> $*" >&2; }
# A usage or setup error: exit 2.
die() {
    echo "$PROG: $*" >&2
    exit 2
}

# Real-time windows widen on a busy machine: EDGEVOL_TEST_TIME_SCALE (a whole number, default 1;
# `scripts/test.sh --under-load` sets 3) multiplies the suite's step budgets, the VMs' timeouts
# and the log waits here; the Rust tests and the guests (edgevol.time_scale=) read it too.
# time_scale_load reads it into TIME_SCALE; `scaled SECS` prints SECS times it.
time_scale_load() {
    TIME_SCALE=${EDGEVOL_TEST_TIME_SCALE:-1}
    [[ "$TIME_SCALE" =~ ^[1-9][0-9]?$ ]] ||
        die "EDGEVOL_TEST_TIME_SCALE must be a whole number from 1 to 99, not '$TIME_SCALE'"
}
scaled() { echo $(($1 * TIME_SCALE)); }
time_scale_load
# The script's header comment (line 2 up to `set -euo pipefail`), as its --help.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# Command-line options from one declaration: opts_parse 'SPEC...' "$@". A SPEC word NAME takes a
# value (`--NAME V` sets $NAME; dashes in NAME become underscores), NAME+ repeats (each value is
# appended to the array NAME), NAME! is a flag (sets $NAME to 1). The caller sets the defaults
# before. -h/--help prints usage; `--` ends the options and leaves the rest in OPTS_REST; an
# unknown option, a missing value or a stray argument exits 2.
# shellcheck disable=SC2034 # OPTS_REST is the caller's
opts_parse() {
    local spec=" ${1//[$'\n\t']/ } " opt var
    shift
    OPTS_REST=()
    while (($#)); do
        case "$1" in
        --) shift; OPTS_REST=("$@"); return 0 ;;
        -h | --help) usage; exit 0 ;;
        --?*) ;;
        *) die "unexpected argument '$1' (see --help)" ;;
        esac
        opt="${1#--}" var="${1#--}"
        var="${var//-/_}"
        if [[ "$spec" == *" $opt! "* ]]; then
            printf -v "$var" 1
            shift
            continue
        fi
        [[ "$spec" == *" $opt "* || "$spec" == *" $opt+ "* ]] || die "unknown option $1 (see --help)"
        (($# >= 2)) || die "$1 needs a value"
        if [[ "$spec" == *" $opt+ "* ]]; then
            eval "$var+=(\"\$2\")"
        else
            printf -v "$var" '%s' "$2"
        fi
        shift 2
    done
}

# Runs a command as root (sudo when not root).
as_root() { if ((EUID)); then sudo "$@"; else "$@"; fi; }

# apt packages, installed only when missing.
apt_need() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing Debian packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        as_root apt-get update -qq
        as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# A Rust toolchain (rustup) with what the workspace builds need.
rust_setup() {
    apt_need build-essential ca-certificates curl pkg-config
    if ! command -v cargo >/dev/null; then
        if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
            export PATH="$HOME/.cargo/bin:$PATH"
        else
            log "installing Rust with rustup"
            curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
            export PATH="$HOME/.cargo/bin:$PATH"
        fi
    fi
    if command -v rustup >/dev/null; then
        rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
        rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
    fi
}

# --- pinned Debian packages ----------------------------------------------------------------------

# deb_unpack PKG VERSION DIR: the Debian package PKG at exactly VERSION (apt-get download, the
# .deb cached in $CACHE/debs) unpacked into DIR. Once: DIR/.extracted-VERSION marks it done, and
# another pin replaces DIR whole (unpacked beside it, then renamed in).
deb_unpack() {
    local pkg=$1 ver=$2 dir=$3 deb tmp
    [[ -f "$dir/.extracted-$ver" ]] && return 0
    mkdir -p "$CACHE/debs" "$(dirname "$dir")"
    chmod 0755 "$CACHE/debs" # apt's _apt user writes the download (no sandbox warning)
    deb="$CACHE/debs/${pkg}_${ver//:/%3a}.deb"
    if [[ ! -s "$deb" ]]; then
        log "fetching $pkg=$ver"
        tmp="$(mktemp -d "$CACHE/debs/dl.XXXXXX")"
        chmod 0755 "$tmp"
        # A stale package list may not know the pinned version yet: update once and retry.
        if ! (cd "$tmp" && apt-get download "$pkg=$ver" >&2); then
            as_root apt-get update -qq
            (cd "$tmp" && apt-get download "$pkg=$ver" >&2) || { rm -rf "$tmp"; return 1; }
        fi
        mv "$tmp"/*.deb "$deb"
        rmdir "$tmp"
    fi
    tmp="$(mktemp -d "$dir.new.XXXXXX")"
    dpkg-deb -x "$deb" "$tmp"
    chmod 0755 "$tmp"
    touch "$tmp/.extracted-$ver"
    rm -rf "$dir"
    mv "$tmp" "$dir"
}

# --- kernels and modules -------------------------------------------------------------------------

# kernel_select [default|auth]: one of the pinned kernels of qemu/versions.env, the default one
# or the one with NVMe in-band authentication. Sets KERNEL_PKG, KERNEL_VERSION, KERNEL_RELEASE
# and where scripts/setup-qemu.sh unpacks it: KDIR, KERNEL (the vmlinuz), MODDIR (its modules,
# with modules.dep).
# shellcheck disable=SC2034 # KERNEL, MODDIR are the caller's
kernel_select() {
    case "${1:-default}" in
    default)
        KERNEL_PKG=$EDGEVOL_KERNEL_PKG KERNEL_VERSION=$EDGEVOL_KERNEL_VERSION
        KERNEL_RELEASE=$EDGEVOL_KERNEL_RELEASE
        ;;
    auth)
        KERNEL_PKG=$EDGEVOL_AUTH_KERNEL_PKG KERNEL_VERSION=$EDGEVOL_AUTH_KERNEL_VERSION
        KERNEL_RELEASE=$EDGEVOL_AUTH_KERNEL_RELEASE
        ;;
    *) die "unknown kernel '$1' (default, auth)" ;;
    esac
    KDIR="$CACHE/kernel/$KERNEL_RELEASE"
    KERNEL="$KDIR/boot/vmlinuz-$KERNEL_RELEASE"
    MODDIR="$KDIR/lib/modules/$KERNEL_RELEASE"
}

# kernel_fetch [FLAVOUR]: kernel_select, then the kernel's .deb unpacked into KDIR, with the
# modules.dep the package leaves to its postinst (depmod) built here.
kernel_fetch() {
    kernel_select "$@"
    deb_unpack "$KERNEL_PKG" "$KERNEL_VERSION" "$KDIR"
    [[ -f "$MODDIR/modules.dep" ]] || depmod -b "$KDIR" "$KERNEL_RELEASE"
}

# modules_install MODDIR ROOTFS NAME...: the kernel modules NAME (dashes or underscores) and their
# dependencies (MODDIR/modules.dep) decompressed into ROOTFS/lib/modules, and their load order,
# dependencies first, in ROOTFS/lib/modules/load.list (guest_init of qemu/guest-lib.sh insmods
# it). A module the kernel has built in (modules.builtin; e.g. virtio_pci in 6.12, a module in
# 6.1) needs nothing; one it does not have at all is an error.
modules_install() {
    local moddir=$1 rootfs=$2 m p b
    shift 2
    local -A seen=()
    local order=()
    for m in "$@"; do
        p="$(_modules_match "$m" <"$moddir/modules.dep")"
        if [[ -n "$p" ]]; then
            _modules_add "$p"
        elif ! _modules_builtin "$moddir" "$m"; then
            echo "$PROG: module $m is not in $moddir (see the kernel config)" >&2
            return 1
        fi
    done
    mkdir -p "$rootfs/lib/modules"
    : >"$rootfs/lib/modules/load.list"
    for p in "${order[@]}"; do
        b="$(basename "$p")"
        case "$p" in
        *.xz) b="${b%.xz}"; xz -dc "$moddir/$p" >"$rootfs/lib/modules/$b" ;;
        *.zst) b="${b%.zst}"; zstd -qdc "$moddir/$p" >"$rootfs/lib/modules/$b" ;;
        *) cp "$moddir/$p" "$rootfs/lib/modules/$b" ;;
        esac
        echo "$b" >>"$rootfs/lib/modules/load.list"
    done
}
# Whether the kernel has module NAME built in: _modules_builtin MODDIR NAME.
_modules_builtin() {
    [[ -n "$(_modules_match "$2" <"$1/modules.builtin")" ]]
}
# The first path (up to a colon) on stdin whose module name is NAME, dashes and underscores alike.
_modules_match() {
    awk -F: -v want="${1//-/_}" '{ b = $1; sub(/.*\//, "", b); sub(/\.ko.*/, "", b);
        gsub(/-/, "_", b); if (b == want) { print $1; exit } }'
}
# One module (path relative to moddir) after its dependencies, into modules_install's order.
_modules_add() {
    local p=$1 d deps
    [[ -n "${seen[$p]:-}" ]] && return 0
    seen[$p]=1
    read -ra deps <<<"$(awk -F: -v p="$p" '$1 == p { print $2; exit }' "$moddir/modules.dep")"
    for d in "${deps[@]}"; do _modules_add "$d"; done
    order+=("$p")
}

# --- VMs: links, ports, pidfiles, the firmware's persistent partition ------------------------------

# The QEMU -netdev of a storage link between two VMs (`link_netdev LOCAL:REMOTE`): UDP datagrams
# between LOCAL and REMOTE ports on 127.0.0.1, which needs no privilege but gives the guests' NICs
# no checksum or segmentation offload (QEMU offers those only over a backend with a vnet header).
# With EDGEVOL_STORAGE_BRIDGE set (root: `storage_bridge_up`), a tap named after LOCAL on that
# bridge instead: offloads as a real NIC has them.
link_netdev() {
    if [[ -n "${EDGEVOL_STORAGE_BRIDGE:-}" ]]; then
        local tap="evt${1%%:*}"
        if ! { ip tuntap add dev "$tap" mode tap &&
            ip link set "$tap" master "$EDGEVOL_STORAGE_BRIDGE" && ip link set "$tap" up; }; then
            die "tap $tap on $EDGEVOL_STORAGE_BRIDGE"
        fi
        echo "tap,id=storage,ifname=$tap,script=no,downscript=no"
        return
    fi
    echo "dgram,id=storage,local.type=inet,local.host=127.0.0.1,local.port=${1%%:*},remote.type=inet,remote.host=127.0.0.1,remote.port=${1#*:}"
}

# A free port on 127.0.0.1: free_port SOCK_STREAM (TCP) or SOCK_DGRAM (UDP).
free_port() {
    # bind(0) hands out a port the kernel may hand out again to the very next call (two
    # forwarding rules of one VM once got the same port), so the ports handed out lately are
    # remembered (under a lock: scripts run side by side) and never given twice in a row.
    python3 - "$1" "$CACHE/run/free-ports" <<'PY'
import fcntl, os, socket, sys
kind, path = getattr(socket, sys.argv[1]), sys.argv[2]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    recent = f.read().split()[-256:]
    while True:
        s = socket.socket(socket.AF_INET, kind)
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
        s.close()
        if port not in recent:
            break
    f.seek(0)
    f.truncate()
    f.write("\n".join(recent + [port]) + "\n")
print(port)
PY
}

# guest_build_lock: an exclusive lock on the static (guest) build's output directory, held until
# the calling script exits or calls guest_build_unlock. A script that builds binaries there and
# copies them takes it, so that QEMU steps can run side by side: the firmware test builds an
# edgevold of another feature set into the same path and puts the plain one back before it lets
# go. Nothing may be started in the background while it is held (the child would hold it too).
guest_build_lock() {
    local dir="${CARGO_TARGET_DIR:-$ROOT/target}/$EDGEVOL_GUEST_TARGET"
    mkdir -p "$dir"
    exec {GUEST_BUILD_LOCK}>"$dir/.edgevol-build.lock"
    flock "$GUEST_BUILD_LOCK"
}
guest_build_unlock() { exec {GUEST_BUILD_LOCK}>&-; }

# wait_log FILE TEXT [SECS]: waits up to SECS (default 15; times TIME_SCALE) for TEXT in a VM's
# log. The consoles copy daemon logs with `tail -f`, so a line may land just after a marker.
wait_log() {
    local _
    for _ in $(seq 1 $((2 * ${3:-15} * TIME_SCALE))); do
        grep -q -- "$2" "$1" && return 0
        sleep 0.5
    done
    return 1
}

# Detached VMs a script started (their pidfiles): vm_track PIDFILE, and vms_stop kills them all
# (call it from the script's EXIT trap).
VM_PIDFILES=()
vm_track() { VM_PIDFILES+=("$1"); }
vms_stop() {
    local p
    for p in "${VM_PIDFILES[@]}"; do
        if [[ -f "$p" ]]; then kill "$(cat "$p" 2>/dev/null)" 2>/dev/null || true; fi # gone is fine
    done
    VM_PIDFILES=()
}

# storage_bridge_up NAME: a bridge for the VMs' storage taps (link_netdev), exported as
# EDGEVOL_STORAGE_BRIDGE; root only. storage_bridge_down removes it with its taps.
storage_bridge_up() {
    if ((EUID != 0)) || [[ ! -c /dev/net/tun ]]; then
        die "a tap storage link needs root and /dev/net/tun"
    fi
    if ! { ip link add "$1" type bridge && ip link set "$1" up; }; then die "bridge $1"; fi
    export EDGEVOL_STORAGE_BRIDGE=$1
}
storage_bridge_down() {
    local b=${EDGEVOL_STORAGE_BRIDGE:-} tap
    [[ -n "$b" ]] || return 0
    for tap in $(ip -o link show master "$b" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
        ip link del "$tap" 2>/dev/null || true # gone with its VM is fine
    done
    ip link del "$b" 2>/dev/null || true
    unset EDGEVOL_STORAGE_BRIDGE
}

# persist_read DISK DIR: the client PKI from the persistent partition of a firmware disk, as an
# operator takes it off the box, into DIR/pki; prints the appliance id. A copy of the (possibly
# live) ext4 partition is made consistent (journal replayed) by e2fsck, then read by debugfs.
persist_read() {
    local disk=$1 dir=$2 part id
    mkdir -p "$dir"
    part="$(mktemp "$dir/persist.XXXXXX")"
    dd if="$disk" of="$part" bs=1M skip=$((1 + EDGEVOL_BOOT_MIB)) count="$EDGEVOL_PERSIST_MIB" status=none
    e2fsck -fy "$part" >/dev/null 2>&1 || (($? <= 1)) || { echo "$PROG: e2fsck of the persistent partition failed" >&2; rm -f "$part"; return 1; }
    debugfs -R "rdump /pki $dir" "$part" 2>/dev/null
    id="$(debugfs -R "cat /state/appliance-id" "$part" 2>/dev/null | tr -d '[:space:]')"
    rm -f "$part"
    [[ -f "$dir/pki/controller.key" && -n "$id" ]] || { echo "$PROG: no PKI or appliance id on the persistent partition" >&2; return 1; }
    echo "$id"
}
