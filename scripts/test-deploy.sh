#!/usr/bin/env bash
# The deploy checks, on the host, no VM: PARTS are any of
#   grpcio      grpcio (gRPC C-core, from PyPI) over the unix sockets of `edgevol proxy` and
#               `edgevol-node`: two dev edgevolds with the ids of deploy/kubernetes' fleet.toml
#               (one CA); a proxy on the first alone (plain HOST:PORT): Identity and Node
#               calls, Kubernetes' CreateVolume with --extra-create-metadata, a secret key
#               refused, the claim in `edgevol volumes`, then the CreateVolume calls each
#               orchestrator makes from deploy/ for one appliance replayed (the StorageClass as
#               the pinned external-provisioner passes it, Nomad's volume specification, every
#               Swarm scope x sharing x type); a proxy reading fleet.toml (--config), the node
#               plugin with the DaemonSet's --topology flags: every StorageClass (examples too)
#               and Nomad volume replayed as the provisioner sends it for that node, placed on
#               an appliance its topology allows, replicated ones on two, each usable there
#   manifests   deploy/kubernetes and its overlays rendered and validated offline and strictly
#               against every Kubernetes version each is for (kubernetes-validate); the
#               sidecars' rules (StorageClass parameters as external-provisioner reads them,
#               flags, feature gates, minimum Kubernetes and VolumeAttributesClass API of each
#               pinned sidecar), shown to refuse what 0.1.0 shipped; RBAC against upstream; the
#               VolumeSnapshotClass against its CRD schema; the Nomad and Swarm files parsed and
#               checked (their args evaluated for one and several appliances, the Swarm
#               entrypoint run under busybox sh with stub binaries), fleet.toml parsed with the
#               proxy's rules and matched with the node flags and every class's topology, the
#               README's Swarm access-mode table
#   monitoring  deploy/monitoring: the alerting rules checked and unit-tested (promtool), and
#               every metric the rules and the Grafana dashboard name served by a dev edgevold
#   images      the OCI images built (scripts/build-images.sh) and their binaries and host tools
#               (mkfs, mount, modprobe, mdadm, cryptsetup on a file...) run inside (needs root,
#               a release build)
# (default: all). Needs the debug binaries (cargo build, done here), Python tools from
# scripts/setup-python.sh and promtool (Debian's prometheus package, installed here).
#
# Usage: scripts/test-deploy.sh [PART...]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
parts=("$@")
((${#parts[@]})) || parts=(grpcio manifests monitoring images)

PY="$(./scripts/setup-python.sh)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
work="$(mktemp -d /tmp/edgevol-deploy.XXXXXX)"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done # gone is fine
    wait 2>/dev/null || true
    # A chroot interrupted by the step's timeout may leave /proc and /dev mounted in an
    # unpacked image: unmount them, and never let rm cross into another filesystem.
    findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount -l 2>/dev/null || true
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# wait_for TEST SECS WHAT: polls the shell test TEST every 0.2 s.
wait_for() {
    local _
    for _ in $(seq 1 $((5 * $2))); do
        eval "$1" && return 0
        sleep 0.2
    done
    echo "$PROG: $3 did not come up; its log:" >&2
    cat "$work"/*.log >&2 || true
    return 1
}

# build_debug: the binaries `cargo test --workspace` builds for the crates' integration tests:
# the same command (a no-op after scripts/test.sh's test step), so no second feature set is
# built. Once per run.
built=0
build_debug() {
    ((built)) && return 0
    log "building edgevold, edgevol and edgevol-node (cargo test --workspace --no-run)"
    cargo test -q --workspace --locked --no-run
    built=1
}

# start_edgevold NAME ARGS...: a dev edgevold with its data in $work/NAME and its log in
# $work/NAME.log, its CSI endpoint on a free port (EDGEVOLD_PORT), up when this returns.
start_edgevold() {
    local name=$1 nvme_port
    shift
    EDGEVOLD_PORT="$(free_port SOCK_STREAM)" nvme_port="$(free_port SOCK_STREAM)"
    "$TARGET/debug/edgevold" --dev --data-dir "$work/$name" --listen "127.0.0.1:$EDGEVOLD_PORT" \
        --nvme-listen "127.0.0.1:$nvme_port" "$@" >"$work/$name.log" 2>&1 &
    pids+=($!)
    wait_for "[[ -f $work/$name/pki/controller.key ]] && (exec 3<>/dev/tcp/127.0.0.1/$EDGEVOLD_PORT) 2>/dev/null" 60 edgevold
}

# fleet_toml IN OUT ID=PORT...: the ConfigMap's fleet.toml (IN, a rendered kustomization) with
# each appliance's address replaced by 127.0.0.1:PORT of the dev appliance of that id.
fleet_toml() {
    local in=$1 out=$2
    shift 2
    (cd tests/deploy && "$PY" - "$in" "$out" "$@") <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
text = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "edgevol-config")["data"]["fleet.toml"]
ports = dict(a.split("=") for a in sys.argv[3:])
import fleet
appliances = fleet.parse_fleet(text)
assert sorted(a[0] for a in appliances) == sorted(ports), f"fleet.toml {appliances}, dev appliances {ports}"
for ident, address, _ in appliances:
    text = text.replace(f'address = "{address}"', f'address = "127.0.0.1:{ports[ident]}"', 1)
assert fleet.parse_fleet(text) == [(i, f"127.0.0.1:{ports[i]}", n) for i, _, n in appliances]
open(sys.argv[2], "w").write(text)
PYEOF
}

part_grpcio() {
    build_debug
    # The appliances deploy/kubernetes names (fleet.toml): dev appliances with those ids and one
    # CA (the first one's dev PKI, shared), so one controller certificate reaches both.
    local ids=() id ports=() pki="$work/box-7/pki" rendered="$work/kubernetes.yaml"
    (cd tests/deploy && "$PY" manifests.py deploy/kubernetes "$rendered")
    mapfile -t ids < <(cd tests/deploy && "$PY" -c 'import fleet, manifests as m; print("\n".join(a[0] for a in fleet.fleet_of(m.documents())))')
    ((${#ids[@]} >= 2)) || die "deploy/kubernetes' fleet.toml lists ${#ids[@]} appliance(s); the replay needs two"
    for id in "${ids[@]}"; do
        if [[ $id != "${ids[0]}" ]]; then
            mkdir -p "$work/$id"
            ln -s "$pki" "$work/$id/pki"
        fi
        start_edgevold "$id" --metrics-listen off --appliance-id "$id"
        ports+=("$id=$EDGEVOLD_PORT")
    done
    local port=${ports[0]#*=}
    fleet_toml "$rendered" "$work/fleet.toml" "${ports[@]}"
    local tls=(--server-name localhost --ca "$pki/ca.pem" --cert "$pki/controller.pem" --key "$pki/controller.key")
    # One appliance, the plain form: every call forwarded untouched.
    "$TARGET/debug/edgevol" proxy --listen "unix://$work/csi.sock" --appliance "127.0.0.1:$port" \
        "${tls[@]}" >"$work/proxy.log" 2>&1 &
    pids+=($!)
    # The controller as deploy/kubernetes runs it: every appliance from fleet.toml.
    "$TARGET/debug/edgevol" proxy --listen "unix://$work/fleet.sock" --config "$work/fleet.toml" \
        "${tls[@]}" >"$work/fleet-proxy.log" 2>&1 &
    pids+=($!)
    # The node plugin with the DaemonSet's topology flags (no enrolment: no data path here).
    local topology=()
    mapfile -t topology < <(cd tests/deploy && "$PY" -c 'import check_manifests as c, manifests as m
node, _ = c.container(m.documents(), "DaemonSet", "node")
print("\n".join("--topology=" + t for t in c.args_of(node, "topology")))')
    "$TARGET/debug/edgevol-node" --endpoint "unix://$work/node/csi.sock" \
        --node-id-file "$work/node/hostnqn" --hostid-file "$work/node/hostid" \
        --state-dir "$work/node/state" "${topology[@]}" >"$work/node.log" 2>&1 &
    pids+=($!)
    wait_for "[[ -S $work/csi.sock && -S $work/fleet.sock && -S $work/node/csi.sock ]]" 30 "the unix sockets"

    (cd tests/deploy && "$PY" grpcio_unix.py --proxy "$work/csi.sock" --fleet-proxy "$work/fleet.sock" \
        --node "$work/node/csi.sock")
    local listing
    listing="$("$TARGET/debug/edgevol" volumes --appliance "127.0.0.1:$port" --server-name localhost \
        --ca "$pki/ca.pem" --cert "$pki/observer.pem" --key "$pki/observer.key")"
    grep -q ' deploy-test/grpcio-claim  *pvc-grpcio ' <<<"$listing" ||
        { echo "$PROG: edgevol volumes does not show the claim:"$'\n'"$listing" >&2; return 1; }
    log "ok: edgevol volumes shows the claim and PV"
}

# kubernetes-validate --strict: unknown fields are errors. Each kustomization (the base and its
# overlays) is rendered by tests/deploy/manifests.py and validated against every Kubernetes
# minor version it is for. Custom resources (VolumeSnapshotClass) have no schema there:
# check_manifests.py checks them against their CRD schema.
part_manifests() {
    # The Swarm plugin's entrypoint runs under busybox sh. The static build: the QEMU guests copy
    # /bin/busybox, and the two packages replace each other.
    apt_need busybox-static
    local kv="${PY%/python}/kubernetes-validate" variant low high out n
    while read -r variant low high; do
        out="$work/$(tr / _ <<<"$variant").yaml"
        (cd tests/deploy && "$PY" manifests.py "$variant" "$out")
        for ((n = ${low#1.}; n <= ${high#1.}; n++)); do
            "$kv" --strict --quiet -k "1.$n.0" "$out" deploy/kubernetes/examples/pvc.yaml \
                deploy/kubernetes/examples/storageclass-*.yaml
        done
        log "ok: $variant, the example claim and StorageClasses valid (strict) against Kubernetes $low to $high"
    done < <(cd tests/deploy && "$PY" manifests.py)
    # The QoS class examples: storage.k8s.io/v1 from 1.34, v1beta1 (opt-in) on 1.31 to 1.33.
    for n in 34 35 36; do
        "$kv" --strict --quiet -k "1.$n.0" deploy/kubernetes/examples/volumeattributesclass.yaml
    done
    for n in 31 32 33; do
        "$kv" --strict --quiet -k "1.$n.0" \
            deploy/kubernetes/overlays/k8s-1.31-1.33/volumeattributesclass-v1beta1.yaml
    done
    log "ok: the VolumeAttributesClass examples valid (strict) against their Kubernetes versions"
    (cd tests/deploy && "$PY" check_manifests.py)
    (cd tests/deploy && "$PY" check_orchestrators.py)
}

# deploy/monitoring: the rules checked and unit-tested by promtool, then every metric the rules,
# their test series and the dashboard name compared with what a dev edgevold serves.
part_monitoring() {
    apt_need prometheus # promtool
    (cd deploy/monitoring && promtool check rules edgevol-alerts.yaml &&
        promtool test rules edgevol-alerts.test.yaml)
    log "ok: the alerting rules pass promtool check rules and their unit tests"
    build_debug
    local mport
    mport="$(free_port SOCK_STREAM)"
    start_edgevold metrics --metrics-listen "127.0.0.1:$mport"
    (cd tests/deploy && "$PY" check_monitoring.py --url "http://127.0.0.1:$mport/metrics")
}

# run_in ROOTFS CMD...: CMD inside an unpacked image's root filesystem (chroot), with /proc and
# /dev of the host mounted there for the duration.
run_in() {
    local r=$1 rc=0
    shift
    mount -t proc proc "$r/proc"
    mount --bind /dev "$r/dev"
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$r" "$@" || rc=$?
    umount "$r/dev" "$r/proc"
    return "$rc"
}

# unpack ARCHIVE DIR: the image's root filesystem, as a runtime would see it, in DIR/rootfs.
unpack() {
    local layout="$2.layout" tag
    mkdir -p "$layout"
    tar -xf "$1" -C "$layout"
    tag="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])' "$layout/index.json")"
    umoci unpack --image "$layout:$tag" "$2" >/dev/null 2>&1
}

part_images() {
    local images cli node v out
    mapfile -t images < <(./scripts/build-images.sh --out "$work/oci")
    cli="$work/img-cli" node="$work/img-node"
    unpack "${images[0]}" "$cli"
    unpack "${images[1]}" "$node"
    v="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
    run_in "$cli/rootfs" edgevol --version | grep -qx "edgevol $v"
    run_in "$node/rootfs" edgevol-node --version | grep -qx "edgevol-node $v"
    log "ok: edgevol and edgevol-node $v run inside their images"
    # The host tools edgevol-node runs, on a file in the image's /tmp (a loop device for mount).
    local img=/tmp/fs.img
    truncate -s 320M "$node/rootfs$img"
    run_in "$node/rootfs" mkfs.ext4 -q -F "$img"
    run_in "$node/rootfs" blkid -p -o value -s TYPE "$img" | grep -qx ext4
    run_in "$node/rootfs" e2fsck -p "$img" >/dev/null
    truncate -s 400M "$node/rootfs$img"
    run_in "$node/rootfs" resize2fs "$img" >/dev/null 2>&1
    mkdir -p "$node/rootfs/mnt"
    run_in "$node/rootfs" sh -c true 2>/dev/null && die "the node image has a shell; it should hold only its tools"
    run_in "$node/rootfs" mount -o loop "$img" /mnt
    run_in "$node/rootfs" umount /mnt
    run_in "$node/rootfs" mkfs.xfs -q -f "$img"
    run_in "$node/rootfs" blkid -p -o value -s TYPE "$img" | grep -qx xfs
    run_in "$node/rootfs" mount -o loop "$img" /mnt
    run_in "$node/rootfs" xfs_growfs /mnt >/dev/null
    run_in "$node/rootfs" umount /mnt
    run_in "$node/rootfs" fsck --version >/dev/null
    # mdadm (mirrored volumes) reads a device: a filesystem image holds no md superblock.
    run_in "$node/rootfs" mdadm --version 2>&1 | grep -q '^mdadm - v'
    if out="$(run_in "$node/rootfs" mdadm --examine "$img" 2>&1)"; then
        die "mdadm --examine found an md superblock on a filesystem image: $out"
    fi
    grep -q "No md superblock detected on $img" <<<"$out" || die "unexpected mdadm output: $out"
    # modprobe resolves nvme-tcp and its dependencies in a kernel's module tree mounted at
    # /lib/modules, as edgevol-node does at start on a host without /dev/nvme-fabrics: the
    # pinned test kernel's tree (a dry run: nothing is loaded into this kernel).
    kernel_fetch default
    mount --bind "$MODDIR/.." "$node/rootfs/usr/lib/modules"
    out="$(run_in "$node/rootfs" modprobe --show-depends --set-version "$KERNEL_RELEASE" nvme-tcp)" || {
        umount "$node/rootfs/usr/lib/modules"
        die "modprobe failed in the node image: $out"
    }
    umount "$node/rootfs/usr/lib/modules"
    if ! grep -q "/lib/modules/$KERNEL_RELEASE/.*/nvme-fabrics\.ko" <<<"$out" ||
        ! grep -q "/nvme-tcp\.ko" <<<"$out"; then
        die "modprobe did not resolve nvme-tcp and nvme-fabrics: $out"
    fi
    log "ok: mkfs.ext4, e2fsck, resize2fs, mkfs.xfs, blkid, mount (loop), xfs_growfs, umount, fsck, mdadm, modprobe run inside the node image"
    # cryptsetup (encrypted volumes) with its libraries, on a regular file: what needs no
    # device-mapper. The passphrase on stdin as edgevol-node gives it; a small argon2id cost.
    local luks=/tmp/luks.img
    truncate -s 32M "$node/rootfs$luks"
    printf 'right passphrase' | run_in "$node/rootfs" cryptsetup luksFormat --batch-mode \
        --type luks2 --pbkdf argon2id --pbkdf-memory 32768 --pbkdf-parallel 1 --iter-time 100 \
        --key-file=- "$luks"
    # The header the appliance recognises a snapshot of an encrypted volume by: LUKS\xba\xbe, 2.
    [[ "$(head -c 8 "$node/rootfs$luks" | od -An -tx1 | tr -d ' \n')" == 4c554b53babe0002 ]] ||
        die "cryptsetup in the node image wrote no LUKS2 header at the file's start"
    out="$(run_in "$node/rootfs" cryptsetup luksDump "$luks")"
    grep -Eq '^Version:[[:space:]]+2$' <<<"$out" || die "luksDump shows no LUKS2 header: $out"
    grep -Eq '^[[:space:]]+PBKDF:[[:space:]]+argon2id$' <<<"$out" || die "luksDump shows no argon2id slot: $out"
    printf 'right passphrase' | run_in "$node/rootfs" cryptsetup open --test-passphrase --key-file=- "$luks" ||
        die "cryptsetup in the node image refused the passphrase it formatted with"
    local rc=0
    printf 'wrong passphrase' | run_in "$node/rootfs" cryptsetup open --test-passphrase --key-file=- "$luks" 2>/dev/null || rc=$?
    # 2: no key slot opens with this passphrase (cryptsetup's exit codes).
    ((rc == 2)) || die "cryptsetup in the node image answered a wrong passphrase with exit $rc, not 2"
    rm -f "$node/rootfs$luks"
    log "ok: cryptsetup luksFormat (LUKS2, argon2id), luksDump and open --test-passphrase (right key opens, wrong key refused) run inside the node image"

    # The Swarm plugin: its config.json's entrypoint runs in its rootfs (busybox sh) and
    # refuses to start unconfigured, naming the setting.
    local plugin="$work/plugin"
    mkdir -p "$plugin"
    tar -xzf "${images[2]}" -C "$plugin"
    plugin="$plugin/edgevol-swarm-plugin"
    cmp -s "$plugin/config.json" deploy/swarm/config.json
    local entry
    entry="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["entrypoint"][0])' "$plugin/config.json")"
    run_in "$plugin/rootfs" busybox sh -n "$entry"
    run_in "$plugin/rootfs" edgevol --version | grep -qx "edgevol $v"
    run_in "$plugin/rootfs" edgevol-node --version | grep -qx "edgevol-node $v"
    if out="$(run_in "$plugin/rootfs" "$entry" 2>&1)"; then
        die "the Swarm plugin's entrypoint started without EDGEVOL_APPLIANCES"
    fi
    grep -q EDGEVOL_APPLIANCE <<<"$out" || die "unexpected entrypoint failure: $out"
    log "ok: the Swarm plugin's entrypoint runs in its rootfs and asks for its settings"
}

for part in "${parts[@]}"; do
    case "$part" in
    grpcio) part_grpcio ;;
    manifests) part_manifests ;;
    monitoring) part_monitoring ;;
    images) part_images ;;
    *) die "unknown part '$part' (grpcio, manifests, monitoring, images)" ;;
    esac
done
