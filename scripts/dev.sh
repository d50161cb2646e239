#!/usr/bin/env bash
# Set up and run the appliance on its embedded default: a sparse file-backed pool and a
# generated dev PKI under ./edgevol-dev (override with EDGEVOL_DEV_DIR), CSI on 127.0.0.1:9500.
# Extra arguments go to edgevold (e.g. --listen 0.0.0.0:9500).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
rust_setup
log "building edgevold and edgevol (release)"
cargo build --release -q -p edgevol-appliance -p edgevol-cli
exec "$ROOT/target/release/edgevold" --dev --data-dir "${EDGEVOL_DEV_DIR:-./edgevol-dev}" "$@"
