#!/usr/bin/env bash
# The deploy checks (issue 18), on the host, no VM: PARTS are any of
#   grpcio     grpcio (gRPC C-core, from PyPI) over the unix sockets of `edgevol proxy` (in front of
#              a dev edgevold) and `edgevol-node`: Identity and Node calls, Kubernetes' CreateVolume
#              with --extra-create-metadata, a secret key refused, the claim in `edgevol volumes`
#   manifests  deploy/kubernetes validated offline and strictly against the Kubernetes 1.30 and
#              1.34 schemas (kubernetes-validate), the VolumeSnapshotClass against its CRD schema,
#              the manifests' consistency test, the Nomad and Swarm files parsed and checked
#   images     the OCI images built (scripts/build-images.sh) and their binaries run inside
# (default: all). Needs the debug binaries (cargo build, done here) and Python tools from
# scripts/setup-python.sh.
#
# Usage: scripts/test-deploy.sh [PART...]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
parts=("$@")
((${#parts[@]})) || parts=(grpcio manifests images)

PY="$(./scripts/setup-python.sh)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
work="$(mktemp -d /tmp/edgevol-deploy.XXXXXX)"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done # gone is fine
    wait 2>/dev/null || true
    rm -rf "$work"
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

part_grpcio() {
    log "building edgevold, edgevol and edgevol-node"
    cargo build -q --locked -p edgevol-appliance -p edgevol-cli -p edgevol-node
    local port nvme_port
    port="$(free_port SOCK_STREAM)" nvme_port="$(free_port SOCK_STREAM)"
    "$TARGET/debug/edgevold" --dev --data-dir "$work/box" --listen "127.0.0.1:$port" \
        --nvme-listen "127.0.0.1:$nvme_port" --metrics-listen off >"$work/edgevold.log" 2>&1 &
    pids+=($!)
    wait_for "[[ -f $work/box/pki/controller.key ]] && (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null" 60 edgevold
    local pki="$work/box/pki"
    "$TARGET/debug/edgevol" proxy --listen "unix://$work/csi.sock" --appliance "127.0.0.1:$port" \
        --server-name localhost --ca "$pki/ca.pem" --cert "$pki/controller.pem" \
        --key "$pki/controller.key" >"$work/proxy.log" 2>&1 &
    pids+=($!)
    "$TARGET/debug/edgevol-node" --endpoint "unix://$work/node/csi.sock" \
        --node-id-file "$work/node/hostnqn" --hostid-file "$work/node/hostid" \
        --state-dir "$work/node/state" >"$work/node.log" 2>&1 &
    pids+=($!)
    wait_for "[[ -S $work/csi.sock && -S $work/node/csi.sock ]]" 30 "the unix sockets"

    (cd tests/deploy && "$PY" grpcio_unix.py --proxy "$work/csi.sock" --node "$work/node/csi.sock")
    local listing
    listing="$("$TARGET/debug/edgevol" volumes --appliance "127.0.0.1:$port" --server-name localhost \
        --ca "$pki/ca.pem" --cert "$pki/observer.pem" --key "$pki/observer.key")"
    grep -q ' deploy-test/grpcio-claim  *pvc-grpcio ' <<<"$listing" ||
        { echo "$PROG: edgevol volumes does not show the claim:"$'\n'"$listing" >&2; return 1; }
    log "ok: edgevol volumes shows the claim and PV"
}

# kubernetes-validate --strict: unknown fields are errors. Custom resources (VolumeSnapshotClass)
# have no schema there: check_manifests.py checks them against their CRD schema.
K8S_VERSIONS=(1.30.0 1.34.0)
part_manifests() {
    local kv="${PY%/python}/kubernetes-validate" files=() f v
    for f in $(sed -n 's/^  - \(.*\.yaml\)$/\1/p' deploy/kubernetes/kustomization.yaml); do
        [[ $f == volumesnapshotclass.yaml ]] || files+=("deploy/kubernetes/$f")
    done
    files+=(deploy/kubernetes/examples/pvc.yaml)
    for v in "${K8S_VERSIONS[@]}"; do
        "$kv" --strict --quiet -k "$v" "${files[@]}"
        log "ok: ${#files[@]} manifests valid (strict) against Kubernetes $v"
    done
    # storage.k8s.io/v1 VolumeAttributesClass exists from 1.34 on.
    "$kv" --strict --quiet -k 1.34.0 deploy/kubernetes/examples/volumeattributesclass.yaml
    log "ok: the VolumeAttributesClass example valid (strict) against Kubernetes 1.34.0"
    (cd tests/deploy && "$PY" check_manifests.py)
}

for part in "${parts[@]}"; do
    case "$part" in
    grpcio) part_grpcio ;;
    manifests) part_manifests ;;
    *) die "unknown part '$part' (grpcio, manifests, images)" ;;
    esac
done
