#!/usr/bin/env bash
# Print the Debian archive this machine's apt uses: the URI of the first enabled `deb`
# source whose suites include a release itself (not only -security, -updates or
# -backports), read in apt's order: sources.list, then sources.list.d/ (one-line *.list
# and deb822 *.sources files, by name).
#
#   deploy/apt-mirror.sh [APT_DIR]        (default: /etc/apt)
#
# Without one it says so on one line and exits 1. deploy/build-base-image.sh takes its
# default MIRROR from here.
set -euo pipefail

apt_dir="${1:-/etc/apt}"
shopt -s nullglob
files=()
[[ -f "$apt_dir/sources.list" ]] && files+=("$apt_dir/sources.list")
for file in "$apt_dir"/sources.list.d/*; do
    case "$file" in *.list | *.sources) [[ -f "$file" ]] && files+=("$file") ;; esac
done

mirror=""
if ((${#files[@]})); then
    mirror=$(awk '
        # a suite of a release itself: no "-security", "-updates", "-backports" tail
        function release_among(suites,   n, i, list) {
            n = split(suites, list, /[ \t]+/)
            for (i = 1; i <= n; i++) if (list[i] != "" && list[i] !~ /-/) return 1
            return 0
        }
        function usable(uri) { return uri ~ /^(https?|ftp|file):/ }
        function found(uri) { print uri; done = 1; exit }
        function end_stanza(   n, i, uris, types) {
            if (stanza_types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(stanza_enabled) != "no" \
                && release_among(stanza_suites)) {
                n = split(stanza_uris, uris, /[ \t]+/)
                for (i = 1; i <= n; i++) if (usable(uris[i])) found(uris[i])
            }
            stanza_types = stanza_uris = stanza_suites = stanza_enabled = last = ""
        }
        FNR == 1 && deb822 { end_stanza() }
        FNR == 1 { deb822 = FILENAME ~ /\.sources$/ }
        /^[ \t]*#/ { next }
        deb822 && /^[ \t]*$/ { end_stanza(); next }
        deb822 && /^[ \t]/ {  # a continuation of the field before
            if (last == "uris") stanza_uris = stanza_uris " " $0
            if (last == "suites") stanza_suites = stanza_suites " " $0
            next
        }
        deb822 {
            field = tolower($1); sub(/:$/, "", field)
            value = $0; sub(/^[^:]*:[ \t]*/, "", value)
            last = field
            if (field == "types") stanza_types = value
            else if (field == "uris") stanza_uris = value
            else if (field == "suites") stanza_suites = value
            else if (field == "enabled") stanza_enabled = value
            next
        }
        $1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }  # [options]
            if (usable($i) && release_among($(i + 1))) found($i)
        }
        END { if (!done && deb822) end_stanza() }
    ' "${files[@]}")
fi

if [[ -z "$mirror" ]]; then
    echo "no Debian mirror in $apt_dir (sources.list, sources.list.d/*.list, *.sources):" \
        "set MIRROR to the URL of a Debian archive" >&2
    exit 1
fi
echo "$mirror"
