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
# Either flavour boots the pinned 6.1 kernel, or with --kernel auth the 6.12 one with NVMe in-band
# authentication (qemu/versions.env EDGEVOL_AUTH_KERNEL_*), and carries the booted kernel's
# modules.dep and modules.builtin at /lib/modules/RELEASE as a real host does (edgevol-node tells
# from them whether the kernel can authenticate: CONFIG_NVME_AUTH).
# Data-path keys (DH-HMAC-CHAP, issue 15): --enrol DIR (DIR/ca.pem, the appliance's CA, and
# DIR/node.pem, DIR/node.key, a `node` role certificate: edgevol pki issue --role node) starts
# edgevol-node with --appliance ENDPOINT --appliance-ca --node-cert --node-key, ENDPOINT being
# --enrol-endpoint (default 192.168.77.1:9500, edgevold's mTLS listener over the storage link; its
# certificate carries that address). --enrol and --kernel auth add a virtio-rng device (the
# kernel's DH-HMAC-CHAP and the plugin's TLS want a ready random pool). --hostnqn NQN: the node's
# host NQN (/etc/nvme/hostnqn) instead of one edgevol-node generates, e.g. the same node booted
# into another kernel.
#
# usage: qemu/node-vm.sh --bin-dir DIR --link LOCAL:REMOTE --csi-port P --exec-port P
#                        [--addr 192.168.77.2] [--appliance ID] [--bench [--fio PATH]]
#                        [--name node] [--timeout 120] [--lifetime 900] [--kernel default|auth]
#                        [--enrol DIR [--enrol-endpoint HOST:PORT]] [--hostnqn NQN]
#                        [--md] [--crypt] [--reach-host]
#   (with --bench the defaults are --name bench-node --timeout 180 --lifetime 1800)
# DIR holds edgevol-node and e2e-agent (static). --appliance ID: the node's topology segment
# edgevol.io/appliance=ID (a comma-separated list: one --topology flag per appliance the node
# reaches). --md: replicated volumes' needs on top of the default flavour: the raid1 module,
# Debian's mdadm and fio (with their libraries), 1 GiB. --crypt: encrypted volumes' needs on top
# of the default flavour: the dm-crypt module (and xts, ecb: the modes its default cipher, aes-xts,
# is built from; the pinned cloud kernel has aes built in) and
# Debian's cryptsetup with its libraries. --reach-host: the management NIC may open
# connections to the host (slirp 10.0.2.2), for appliances run as host processes.
# Exit as run-guest.sh (0 once EDGEVOL-NODE READY).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
bin_dir="" link="" csi_port="" exec_port="" addr=192.168.77.2 appliance="" bench=0 fio=/usr/bin/fio
name="" timeout="" lifetime="" kernel=default enrol="" enrol_endpoint=192.168.77.1:9500 hostnqn=""
md=0 crypt=0 reach_host=0
opts_parse 'bin-dir link csi-port exec-port addr appliance bench! fio name timeout lifetime kernel
    enrol enrol-endpoint hostnqn md! crypt! reach-host!' "$@"
[[ -n "$bin_dir" && -n "$link" && -n "$csi_port" && -n "$exec_port" ]] ||
    die "--bin-dir, --link, --csi-port and --exec-port are required"
kernel_select "$kernel"
[[ -f "$MODDIR/modules.dep" ]] || die "$MODDIR/modules.dep missing: run scripts/setup-qemu.sh first"
# The running kernel's module indexes, where edgevol-node looks (/lib/modules/$(uname -r)).
common=(--kernel "$kernel" --file "$MODDIR/modules.dep:/lib/modules/$KERNEL_RELEASE/modules.dep"
    --file "$MODDIR/modules.builtin:/lib/modules/$KERNEL_RELEASE/modules.builtin")
append="edgevol.addr=$addr edgevol.appliance=$appliance"
rng=()
if [[ -n "$enrol" ]]; then
    for f in ca.pem node.pem node.key; do
        [[ -f "$enrol/$f" ]] || die "--enrol $enrol: $f missing"
        common+=(--file "$enrol/$f:/etc/edgevol/$f")
    done
    append+=" edgevol.enrol=$enrol_endpoint"
fi
[[ -n "$hostnqn" ]] && append+=" edgevol.hostnqn=$hostnqn"
if [[ -n "$enrol" || "$kernel" == auth ]]; then
    common+=(--module virtio_rng)
    rng=(-device virtio-rng-pci)
fi

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
    if ((md)); then
        apt_need mdadm fio
        flavour=(--mem 1024 "${flavour[@]:2}" --module raid1 --host-bin /sbin/mdadm --host-bin "$fio")
    fi
    if ((crypt)); then
        apt_need cryptsetup-bin
        flavour+=(--module dm-crypt --module xts --module ecb --host-bin /usr/sbin/cryptsetup)
    fi
fi
restrict=on mgmt_nic=""
# Volumes of appliances run as host processes flow over the management NIC: it gets the storage
# NIC's settings against QEMU 7.2's virtio-net stall (seen here too: a 256 MiB fill stopped all
# frames for good, keep-alives lost and every reconnect timing out).
((reach_host)) && restrict=off mgmt_nic=",event_idx=off,rx_queue_size=1024"

exec "$ROOT/qemu/run-guest.sh" --name "$name" --timeout "$timeout" --lifetime "$lifetime" \
    --smp 1 --append "$append" "${common[@]}" \
    --bin "$bin_dir/edgevol-node" --bin "$bin_dir/e2e-agent" \
    --file "$ROOT/qemu/node-guest.sh:/etc/edgevol-node-guest.sh" \
    --module virtio_pci --module virtio_net --module nvme-tcp "${flavour[@]}" \
    --cmd 'sh /etc/edgevol-node-guest.sh' \
    --detach-on 'EDGEVOL-NODE READY' --fail-marker 'EDGEVOL-NODE FAILED' -- \
    -netdev "user,id=mgmt,restrict=$restrict,hostfwd=tcp:127.0.0.1:$csi_port-:7000,hostfwd=tcp:127.0.0.1:$exec_port-:7001" \
    -device "virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:02$mgmt_nic" \
    -netdev "$(link_netdev "$link")" -device "virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:02$nic" \
    "${rng[@]}"
