#!/usr/bin/env bash
# Boot a node VM (qemu/run-guest.sh, detached) running qemu/node-guest.sh: the pinned kernel with
# the NVMe/TCP initiator (nvme-tcp), static musl edgevol-node and the test-only e2e-agent.
# Networks: slirp for the host (agent CSI splice on 127.0.0.1:--csi-port, agent shell on
# 127.0.0.1:--exec-port) and a `-netdev dgram` storage link to the appliance VM. Two flavours:
#   default   the e2e and power-cut node: the xfs module and the host tools the plugin runs,
#             util-linux mount/umount/blkid, e2fsprogs mkfs.ext4/e2fsck/resize2fs and xfsprogs
#             mkfs.xfs/xfs_growfs (Debian 12 packages as installed on the host, with their shared
#             libraries and loader; the packages are installed when missing). 512 MiB.
#   --bench   the benchmark node (scripts/bench-qemu.sh): no xfs nor host tools, but Debian's fio
#             (--fio PATH, default /usr/bin/fio) with its libraries, whose dependency tree is
#             ~80 MiB, hence 1 GiB of memory. Its storage NIC runs with event_idx=off, as the
#             bench appliance VM's: with it on, QEMU 7.2's virtio-net stopped delivering frames to
#             the appliance VM for good under sustained writes (keep-alives lost, reconnects
#             timing out, edgevold and nvmet-tcp alike; upstream QEMU later fixed a "network
#             stall under load" in virtio-net's RX buffer check).
#
# usage: qemu/node-vm.sh --bin-dir DIR --link LOCAL:REMOTE --csi-port P --exec-port P
#                        [--addr 192.168.77.2] [--appliance ID] [--bench [--fio PATH]]
#                        [--name node] [--timeout 120] [--lifetime 900]
#   (with --bench the defaults are --name bench-node --timeout 180 --lifetime 1800)
# DIR holds edgevol-node and e2e-agent (static). --appliance ID: the node's topology segment
# edgevol.io/appliance=ID. Exit as run-guest.sh (0 once EDGEVOL-NODE READY).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
bin_dir="" link="" csi_port="" exec_port="" addr=192.168.77.2 appliance="" bench=0 fio=/usr/bin/fio
name="" timeout="" lifetime=""
opts_parse 'bin-dir link csi-port exec-port addr appliance bench! fio name timeout lifetime' "$@"
[[ -n "$bin_dir" && -n "$link" && -n "$csi_port" && -n "$exec_port" ]] ||
    die "--bin-dir, --link, --csi-port and --exec-port are required"

if ((bench)); then
    [[ -x "$fio" ]] || die "$fio missing (apt: fio)"
    : "${name:=bench-node}" "${timeout:=180}" "${lifetime:=1800}"
    flavour=(--mem 1024 --host-bin "$fio")
    nic=",event_idx=off,rx_queue_size=1024"
else
    : "${name:=node}" "${timeout:=120}" "${lifetime:=900}"
    # The host's tools go into the guest: install the Debian packages that carry them when missing.
    apt_need util-linux e2fsprogs xfsprogs
    flavour=(--mem 512 --module xfs --file /etc/mke2fs.conf:/etc/mke2fs.conf)
    for t in /usr/bin/mount /usr/bin/umount /usr/sbin/blkid /usr/sbin/mkfs.ext4 /usr/sbin/e2fsck \
        /usr/sbin/resize2fs /usr/sbin/mkfs.xfs /usr/sbin/xfs_growfs; do
        [[ -x "$t" ]] || die "$t missing (apt: util-linux, e2fsprogs, xfsprogs)"
        flavour+=(--host-bin "$t")
    done
    nic=""
fi

exec "$ROOT/qemu/run-guest.sh" --name "$name" --timeout "$timeout" --lifetime "$lifetime" \
    --smp 1 --append "edgevol.addr=$addr edgevol.appliance=$appliance" \
    --bin "$bin_dir/edgevol-node" --bin "$bin_dir/e2e-agent" \
    --file "$ROOT/qemu/node-guest.sh:/etc/edgevol-node-guest.sh" \
    --module virtio_pci --module virtio_net --module nvme-tcp "${flavour[@]}" \
    --cmd 'sh /etc/edgevol-node-guest.sh' \
    --detach-on 'EDGEVOL-NODE READY' --fail-marker 'EDGEVOL-NODE FAILED' -- \
    -netdev "user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:$csi_port-:7000,hostfwd=tcp:127.0.0.1:$exec_port-:7001" \
    -device virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:02 \
    -netdev "$(link_netdev "$link")" -device "virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:02$nic"
