#!/usr/bin/env bash
# Boot a pinned Debian cloud kernel with a busybox initramfs under QEMU (TCG by default), run one
# shell command as the guest's job, stream the serial console to a log file, and report pass/fail.
#
# usage: qemu/run-guest.sh [options] [-- extra qemu args...]
#   --kernel KERNEL      default (the pinned 6.1 cloud kernel) or auth (the pinned 6.12 cloud
#                        kernel with NVMe in-band authentication); both in qemu/versions.env
#   --name NAME          label for logs and temp files (default: guest)
#   --cmd 'SHELL'        command run by the guest's init (busybox sh -c), after mounts and modules
#   --bin PATH           copy an executable into the guest's /bin (repeatable; static musl expected)
#   --file SRC:DST       copy a host file to DST in the guest (repeatable)
#   --host-bin PATH      copy a dynamically linked host executable (e.g. Debian's /usr/sbin/nvme)
#                        into the guest's /bin under its own name, with the shared libraries and
#                        the loader `ldd` resolves for it, at the same paths (repeatable)
#   --module NAME        load a kernel module (and its dependencies, resolved from modules.dep)
#                        before --cmd runs (repeatable), e.g. --module nvme-tcp --module virtio_net
#   --timeout SECS       hard wall-clock budget for the whole VM (default 120); on expiry QEMU is
#                        killed and the script exits 124. It and --lifetime are multiplied by
#                        EDGEVOL_TEST_TIME_SCALE, which the guest gets as edgevol.time_scale=
#   --log FILE           serial console log (default: qemu/.cache/logs/NAME.log)
#   --pass-marker TEXT   also require this line fragment in the log for a pass
#   --fail-marker TEXT   a log line containing this fails the run (default: 'Kernel panic')
#   --mem MB             guest memory (default 512)    --smp N   guest CPUs (default 1)
#   --append 'ARGS'      extra kernel command line
#   --accel ACCEL        tcg (default) or kvm
#   --detach-on TEXT     do not wait for the guest to finish: return 0 as soon as TEXT appears in
#                        the log (the VM keeps running; its pid is written to --pidfile). For
#                        long-lived VMs (appliance, nodes). Stop it with: kill "$(cat PIDFILE)"
#   --pidfile FILE       where --detach-on writes QEMU's pid (default: qemu/.cache/run/NAME.pid)
#   --lifetime SECS      with --detach-on: a watchdog kills the detached VM after SECS even if
#                        its caller never stops it (default: no limit)
# Exit: 0 pass, 1 fail (guest command failed, fail marker or missing pass marker), 124 timeout,
#       2 usage/setup error.
#
# The guest prints 'EDGEVOL-GUEST-START' before the command and 'EDGEVOL-GUEST-EXIT rc=N' after
# it, then powers off. Give steps inside the command their own budget with busybox `timeout`.
# Every guest holds qemu/guest-lib.sh as /lib/edgevol/guest-lib.sh (its init runs guest_init;
# scripts in the guest source it for the NIC and disk lookups and the other helpers).
# Example (one emulated NVMe drive):
#   qemu/run-guest.sh --name nvme --bin target/x86_64-unknown-linux-musl/release/hal-guest-check \
#     --cmd 'hal-guest-check /dev/nvme0n1 EDGEVOLTEST01' --timeout 90 -- \
#     -drive file=disk.img,if=none,id=d0,format=raw -device nvme,serial=EDGEVOLTEST01,drive=d0
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

kernel=default name=guest cmd=true timeout=120 log="" pass_marker="" fail_marker="Kernel panic"
mem=512 smp=1 append="" accel=tcg detach_on="" pidfile="" lifetime=""
bin=() host_bin=() file=() module=()
opts_parse 'kernel name cmd bin+ file+ host-bin+ module+ timeout log pass-marker fail-marker mem smp
    append accel detach-on pidfile lifetime' "$@"
qemu_extra=("${OPTS_REST[@]}")
kernel_select "$kernel"
timeout=$(scaled "$timeout")
[[ -z "$lifetime" ]] || lifetime=$(scaled "$lifetime")
((TIME_SCALE == 1)) || append="edgevol.time_scale=$TIME_SCALE $append"

[[ -f "$KERNEL" ]] || die "kernel $KERNEL missing: run scripts/setup-qemu.sh first"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run scripts/setup-qemu.sh"
[[ -x /bin/busybox ]] || die "/bin/busybox missing: run scripts/setup-qemu.sh"

mkdir -p "$CACHE/logs" "$CACHE/run"
log="${log:-$CACHE/logs/$name.log}"
pidfile="${pidfile:-$CACHE/run/$name.pid}"
work="$(mktemp -d "$CACHE/run/$name.XXXXXX")"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

# --- initramfs -------------------------------------------------------------------------------
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt,lib/modules,lib/edgevol,usr/bin,usr/sbin}
cp /bin/busybox "$rootfs/bin/busybox"
cp "$ROOT/qemu/guest-lib.sh" "$rootfs/lib/edgevol/guest-lib.sh"
for b in "${bin[@]}"; do
    [[ -f "$b" ]] || die "--bin $b: no such file"
    install -m 0755 "$b" "$rootfs/bin/$(basename "$b")"
done
# Host executables with their libraries: the name is kept (some tools read argv[0], e.g.
# mkfs.ext4 is mke2fs), libraries and loader land at the paths ldd prints.
declare -A host_libs=()
for b in "${host_bin[@]}"; do
    [[ -x "$b" ]] || die "--host-bin $b: no such executable"
    file+=("$(readlink -f "$b"):/bin/$(basename "$b")")
    while read -r lib; do host_libs[$lib]=1; done < <(ldd "$b" | grep -o '/[^ ]*\.so[^ ]*')
done
for lib in "${!host_libs[@]}"; do file+=("$(readlink -f "$lib"):$lib"); done
for f in "${file[@]}"; do
    src="${f%%:*}" dst="${f#*:}"
    [[ -e "$src" && "$dst" == /* ]] || die "--file $f: want an existing SRC and an absolute DST"
    mkdir -p "$rootfs$(dirname "$dst")"
    cp -a "$src" "$rootfs$dst"
done
# Modules with their dependencies (modules.dep built by setup-qemu.sh), loaded by guest_init.
modules_install "$MODDIR" "$rootfs" "${module[@]}" || exit 2

printf '%s\n' "$cmd" >"$rootfs/etc/edgevol-cmd.sh"
cat >"$rootfs/init" <<'INIT'
#!/bin/busybox sh
. /lib/edgevol/guest-lib.sh
guest_init
echo "EDGEVOL-GUEST-START"
sh /etc/edgevol-cmd.sh
rc=$?
echo "EDGEVOL-GUEST-EXIT rc=$rc"
sync
poweroff -f
INIT
chmod 0755 "$rootfs/init"
(cd "$rootfs" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$work/initramfs.gz"

# --- boot ------------------------------------------------------------------------------------
accel_args=(-accel "$accel")
[[ "$accel" == kvm ]] && accel_args+=(-cpu host)
: >"$log"
qemu_cmd=(qemu-system-x86_64 "${accel_args[@]}" -m "$mem" -smp "$smp" -nodefaults -no-reboot
    -display none -monitor none -serial "file:$log"
    -kernel "$KERNEL" -initrd "$work/initramfs.gz"
    -append "console=ttyS0 panic=-1 loglevel=4 $append"
    "${qemu_extra[@]}")
echo "run-guest: $name: ${qemu_cmd[*]}" >&2
start=$(date +%s)

if [[ -n "$detach_on" ]]; then
    # The initramfs is read by QEMU at start only; the temp dir goes when this script exits.
    "${qemu_cmd[@]}" -daemonize -pidfile "$pidfile" || die "qemu failed to start"
    if [[ -n "$lifetime" ]]; then
        setsid bash -c "sleep $lifetime; kill $(cat "$pidfile") 2>/dev/null" </dev/null >/dev/null 2>&1 &
    fi
    while ! grep -qF -- "$detach_on" "$log"; do
        if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            echo "run-guest: $name: VM exited before '$detach_on' (log: $log)" >&2; exit 1
        fi
        if (($(date +%s) - start >= timeout)); then
            kill "$(cat "$pidfile")" 2>/dev/null || true
            echo "run-guest: $name: TIMEOUT after ${timeout}s waiting for '$detach_on' (log: $log)" >&2
            exit 124
        fi
        sleep 0.5
    done
    echo "run-guest: $name: ready after $(($(date +%s) - start))s, pid $(cat "$pidfile") (log: $log)" >&2
    exit 0
fi

set +e
timeout --kill-after=5 "$timeout" "${qemu_cmd[@]}"
qrc=$?
set -e
elapsed=$(($(date +%s) - start))
if ((qrc == 124 || qrc == 137)); then
    echo "run-guest: $name: TIMEOUT after ${timeout}s (log: $log); last lines:" >&2
    tail -n 20 "$log" >&2
    exit 124
fi
verdict=PASS reason=""
if ! grep -q 'EDGEVOL-GUEST-EXIT rc=0' "$log"; then
    verdict=FAIL reason="$(grep -o 'EDGEVOL-GUEST-EXIT rc=[0-9]*' "$log" || echo 'guest command did not finish')"
elif [[ -n "$pass_marker" ]] && ! grep -qF -- "$pass_marker" "$log"; then
    verdict=FAIL reason="pass marker '$pass_marker' missing"
fi
if [[ -n "$fail_marker" ]] && grep -qF -- "$fail_marker" "$log"; then
    verdict=FAIL reason="fail marker '$fail_marker' present"
fi
echo "run-guest: $name: $verdict in ${elapsed}s (qemu rc=$qrc${reason:+, $reason}; log: $log)" >&2
if [[ "$verdict" != PASS ]]; then
    tail -n 30 "$log" >&2
    exit 1
fi
