#!/usr/bin/env bash
# Runs shellcheck over every shell file under scripts/, qemu/, image/ and deploy/: files named
# *.sh and files whose first line starts a shell, sourced files followed (-x; the paths of
# `# shellcheck source=` directives are relative to the repository root). Installs the Debian
# package when missing. Exit 0 = clean.
#
# Guest scripts without a shebang (run with `sh FILE` in busybox guests) say
# `# shellcheck shell=sh`. Files whose shebang is `#!/bin/busybox sh` are checked as dash: Debian
# 12's shellcheck (0.9) has no busybox dialect and would otherwise warn that it checks ash as dash.
#
# usage: scripts/shellcheck.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
apt_need shellcheck

shells=() busybox=()
while IFS= read -r -d '' f; do
    first=$(head -n 1 "$f")
    if [[ $first == '#!/bin/busybox sh'* ]]; then
        busybox+=("$f")
    elif [[ $f == *.sh || $first =~ ^#!.*[/\ ](ba|da|k)?sh([[:space:]]|$) ]]; then
        shells+=("$f")
    fi
done < <(find scripts qemu image deploy -path qemu/.cache -prune -o -type f -print0 | sort -z)
((${#shells[@]})) || die "no shell files found under scripts/ qemu/ image/ deploy/"

log "shellcheck $(shellcheck --version | sed -n 's/^version: //p'): ${#shells[@]} files, ${#busybox[@]} busybox"
rc=0
# Two halves side by side: one shellcheck runs on one core (-x parses lib.sh once per file).
half=$(((${#shells[@]} + 1) / 2))
printf '%s\0' "${shells[@]}" | xargs -0 -n "$half" -P 2 shellcheck -x || rc=1
if ((${#busybox[@]})); then
    shellcheck -x --shell=dash "${busybox[@]}" || rc=1
fi
exit $rc
