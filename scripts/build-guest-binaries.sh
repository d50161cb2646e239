#!/usr/bin/env bash
# Build every static (musl, release) binary the QEMU steps put into guests and images, with the
# same cargo commands the steps run, so that theirs are cache hits afterwards:
#   edgevold and edgevol          the appliance image (image/build.sh)
#   edgevol-node and e2e-agent    the node VMs (test-e2e, -replicated, -encrypted, -faults, -firmware)
#   hal-guest-check               the hal guest (test-hal-qemu.sh)
#   edgevold with test-feature-x  the firmware test's pool-format-feature bundle
# scripts/test.sh runs it in its background lane while the host steps run. It installs nothing:
# run scripts/setup-qemu.sh and apt_need $EDGEVOL_IMAGE_APT_PACKAGES (musl-gcc) first.
#
# usage: scripts/build-guest-binaries.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
command -v musl-gcc >/dev/null || die "musl-gcc is missing (Debian: musl-tools)"
export CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}"
guest=(cargo build --release --locked --target "$EDGEVOL_GUEST_TARGET")
"${guest[@]}" -p edgevol-appliance -p edgevol-cli
"${guest[@]}" -p edgevol-node -p edgevol-e2e --bins
"${guest[@]}" -p edgevol-hal-tools --bins
# The test-feature-x edgevold lands where the plain one is: the plain one goes back under the lock
# (lib.sh's guest_build_lock says why).
guest_build_lock
"${guest[@]}" -p edgevol-appliance -p edgevol-cli --features edgevol-appliance/test-feature-x
"${guest[@]}" -p edgevol-appliance -p edgevol-cli
