# Shared helpers of the project scripts: toolchain set-up that a fresh Debian 12 machine lacks.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { echo "==> $*" >&2; }

# apt packages, installed only when missing.
apt_need() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing Debian packages: ${missing[*]}"
        local sudo=""
        [[ $(id -u) -eq 0 ]] || sudo="sudo"
        export DEBIAN_FRONTEND=noninteractive
        $sudo apt-get update -qq
        $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# A Rust toolchain (rustup) with what the workspace builds need.
rust_setup() {
    apt_need build-essential ca-certificates curl pkg-config
    if ! command -v cargo >/dev/null; then
        if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
            export PATH="$HOME/.cargo/bin:$PATH"
        else
            log "installing Rust with rustup"
            curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
            export PATH="$HOME/.cargo/bin:$PATH"
        fi
    fi
    if command -v rustup >/dev/null; then
        rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
        rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
    fi
}
