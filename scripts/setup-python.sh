#!/usr/bin/env bash
# Install the Python tools of the deploy checks (scripts/python-requirements.txt, pinned) into a
# venv under the cache (EDGEVOL_QEMU_CACHE, else qemu/.cache). Idempotent: a venv whose recorded
# requirements match is kept. Prints the venv's python on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

apt_need python3 python3-venv
req="$ROOT/scripts/python-requirements.txt"
venv="$CACHE/venv-deploy"
if ! cmp -s "$req" "$venv/.requirements" 2>/dev/null; then
    log "creating the Python venv $venv"
    rm -rf "$venv"
    # Debian's python3, not whatever python3 comes first on PATH: the same interpreter on CI.
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: -r "$req" >&2
    cp "$req" "$venv/.requirements"
fi
echo "$venv/bin/python"
