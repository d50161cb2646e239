#!/usr/bin/env bash
# Boot a node VM (qemu/run-guest.sh, detached): the pinned kernel with the NVMe/TCP initiator
# (nvme-tcp) and xfs modules, static musl edgevol-node, the test-only e2e-agent, and the host
# tools the plugin runs: util-linux mount/umount/blkid, e2fsprogs mkfs.ext4/e2fsck/resize2fs and
# xfsprogs mkfs.xfs/xfs_growfs (Debian 12 packages as installed on the host, with their shared
# libraries and loader; the packages are installed when missing). Networks: slirp for the host
# (agent CSI splice on 127.0.0.1:--csi-port, agent shell on 127.0.0.1:--exec-port) and a
# `-netdev dgram` storage link to the appliance VM.
#
# usage: qemu/node-vm.sh --bin-dir DIR --link LOCAL:REMOTE --csi-port P --exec-port P
#                        [--name node] [--addr 192.168.77.2] [--appliance ID] [--timeout 120]
#                        [--lifetime 900]
# DIR holds edgevol-node and e2e-agent (static). Exit as run-guest.sh (0 once EDGEVOL-NODE READY).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib.sh"
name=node bin_dir="" link="" csi_port="" exec_port="" addr=192.168.77.2 appliance="" timeout_s=120
lifetime=900
while (($#)); do
    case "$1" in
    --name) name="$2"; shift 2 ;;
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --link) link="$2"; shift 2 ;;
    --csi-port) csi_port="$2"; shift 2 ;;
    --exec-port) exec_port="$2"; shift 2 ;;
    --addr) addr="$2"; shift 2 ;;
    --appliance) appliance="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --lifetime) lifetime="$2"; shift 2 ;;
    *) echo "node-vm: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -n "$bin_dir" && -n "$link" && -n "$csi_port" && -n "$exec_port" ]] ||
    { echo "node-vm: --bin-dir, --link, --csi-port and --exec-port are required" >&2; exit 2; }

# The host's tools go into the guest: install the Debian packages that carry them when missing.
apt_need util-linux e2fsprogs xfsprogs
files=()
tools=(/usr/bin/mount /usr/bin/umount /usr/sbin/blkid /usr/sbin/mkfs.ext4 /usr/sbin/e2fsck
    /usr/sbin/resize2fs /usr/sbin/mkfs.xfs /usr/sbin/xfs_growfs)
declare -A libs=()
for t in "${tools[@]}"; do
    [[ -x "$t" ]] || { echo "node-vm: $t missing (apt: util-linux, e2fsprogs, xfsprogs)" >&2; exit 2; }
    # mkfs.ext4 is a link to mke2fs, which reads its fs type from argv[0]: keep the name.
    files+=("$(readlink -f "$t"):/bin/$(basename "$t")")
    while read -r lib; do libs[$lib]=1; done < <(ldd "$t" | grep -o '/[^ ]*\.so[^ ]*')
done
for lib in "${!libs[@]}"; do files+=("$(readlink -f "$lib"):$lib"); done
files+=("/etc/mke2fs.conf:/etc/mke2fs.conf" "$ROOT/qemu/node-guest.sh:/etc/edgevol-node-guest.sh")
file_args=()
for f in "${files[@]}"; do file_args+=(--file "$f"); done

exec "$ROOT/qemu/run-guest.sh" --name "$name" --timeout "$timeout_s" --lifetime "$lifetime" \
    --mem 512 --smp 1 --append "edgevol.addr=$addr edgevol.appliance=$appliance" \
    --bin "$bin_dir/edgevol-node" --bin "$bin_dir/e2e-agent" "${file_args[@]}" \
    --module virtio_pci --module virtio_net --module nvme-tcp --module xfs \
    --cmd 'sh /etc/edgevol-node-guest.sh' \
    --detach-on 'EDGEVOL-NODE READY' --fail-marker 'EDGEVOL-NODE FAILED' -- \
    -netdev "user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:$csi_port-:7000,hostfwd=tcp:127.0.0.1:$exec_port-:7001" \
    -device virtio-net-pci,netdev=mgmt,mac=52:54:00:ed:00:02 \
    -netdev "dgram,id=storage,local.type=inet,local.host=127.0.0.1,local.port=${link%%:*},remote.type=inet,remote.host=127.0.0.1,remote.port=${link#*:}" \
    -device virtio-net-pci,netdev=storage,mac=52:54:00:ed:01:02
