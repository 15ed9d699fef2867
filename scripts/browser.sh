#!/usr/bin/env bash
# Debian's chromium for the browser tests (tests/ui), at $CHROMIUM (/usr/bin/chromium):
# installed with apt-get when it is missing and this is root (or sudo needs no password).
# apt may be busy (its lock held by another apt, an unattended upgrade): each failed try is
# followed by `apt-get update` and another, $BROWSER_TRIES tries (3) $BROWSER_RETRY_SECONDS
# (5) apart. Whatever happens it exits 0, saying in one line what the browser tests will do:
# `make test` runs the suite either way, with them skipped where there is no chromium.
set -uo pipefail

chromium=${CHROMIUM:-/usr/bin/chromium}
tries=${BROWSER_TRIES:-3}
pause=${BROWSER_RETRY_SECONDS:-5}

[[ -x "$chromium" ]] && exit 0

skip() {
    echo "make browser: no $chromium, $1: the browser tests (tests/ui) will be skipped"
    exit 0
}

command -v apt-get >/dev/null || skip "and no apt-get to install it"
if [[ "$(id -u)" = 0 ]]; then
    as_root=()
elif sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    skip "and installing it needs root (or password-less sudo)"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q "$@" >>"$log" 2>&1; }

for ((try = 1; try <= tries; try++)); do
    : >"$log"
    if apt install -y chromium || { apt update && apt install -y chromium; }; then
        [[ -x "$chromium" ]] || skip "and apt-get installed chromium somewhere else"
        echo "make browser: installed chromium at $chromium"
        exit 0
    fi
    ((try < tries)) && sleep "$pause"
done
# apt's own reason, e.g. "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by ..."
reason=$(grep -m 1 '^E:' "$log" || tail -n 1 "$log")
skip "and apt-get could not install it in $tries tries (${reason:-no output})"
