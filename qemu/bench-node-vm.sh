#!/usr/bin/env bash
# Boot the benchmark node VM: qemu/node-vm.sh's node (edgevol-node, e2e-agent, the same networks
# and qemu/node-guest.sh) plus Debian's fio copied from the host with its libraries
# (run-guest.sh --host-bin; its dependency tree is ~80 MiB, hence 1 GiB of guest memory).
# The storage NICs of both bench VMs run with event_idx=off: with it on, QEMU 7.2's virtio-net
# stopped delivering frames to the appliance VM for good under sustained writes (keep-alives
# lost, reconnects timing out, edgevold and nvmet-tcp alike; upstream QEMU later fixed a
# "network stall under load" in virtio-net's RX buffer check).
# usage: qemu/bench-node-vm.sh --bin-dir DIR --link LOCAL:REMOTE --csi-port P --exec-port P
#                              [--name bench-node] [--timeout 180] [--lifetime 1800] [--fio PATH]
# Exit as run-guest.sh (0 once EDGEVOL-NODE READY).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name=bench-node bin_dir="" link="" csi_port="" exec_port="" timeout_s=180 lifetime=1800
fio=/usr/bin/fio
while (($#)); do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --link) link="$2"; shift 2 ;;
    --csi-port) csi_port="$2"; shift 2 ;;
    --exec-port) exec_port="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --lifetime) lifetime="$2"; shift 2 ;;
    --fio) fio="$2"; shift 2 ;;
    *) echo "bench-node-vm: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -n "$bin_dir" && -n "$link" && -n "$csi_port" && -n "$exec_port" ]] ||
    { echo "bench-node-vm: --bin-dir, --link, --csi-port and --exec-port are required" >&2; exit 2; }
[[ -x "$fio" ]] || { echo "bench-node-vm: $fio missing (apt: fio)" >&2; exit 2; }

exec "$ROOT/qemu/run-guest.sh" --name "$name" --timeout "$timeout_s" --lifetime "$lifetime" \
    --mem 1024 --smp 1 --append "edgevol.addr=192.168.77.2" \
    --bin "$bin_dir/edgevol-node" --bin "$bin_dir/e2e-agent" --host-bin "$fio" \
    --file "$ROOT/qemu/node-guest.sh:/etc/edgevol-node-guest.sh" \
    --module virtio_pci --module virtio_net --module nvme-tcp \
    --cmd 'sh /etc/edgevol-node-guest.sh' \
    --detach-on 'EDGEVOL-NODE READY' --fail-marker 'EDGEVOL-NODE FAILED' -- \
    -netdev "user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:$csi_port-:7000,hostfwd=tcp:127.0.0.1:$exec_port-:7001" \
    -device virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:02 \
    -netdev "dgram,id=storage,local.type=inet,local.host=127.0.0.1,local.port=${link%%:*},remote.type=inet,remote.host=127.0.0.1,remote.port=${link#*:}" \
    -device virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:02,event_idx=off,rx_queue_size=1024
