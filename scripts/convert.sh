#!/usr/bin/env bash
# Converts every xcloak window whose key matches a pattern to one storage form,
# with SCAN (never KEYS) and XCLOAK.CONVERT, one key per call, so the server
# keeps serving between keys. Safe to run while traffic flows and to re-run:
# a key already in the target form, or gone, is skipped (the command says 0).
#
#   scripts/convert.sh [-h host] [-p port] [-a password] [--user user] [-n db] PATTERN zset|compact
#
# Only keys of the source form are visited (SCAN ... TYPE zset, or TYPE
# xcloaklog), so other keys matching PATTERN are never touched; a sorted set
# that is not a window (a score outside 0..2^53-1) is reported and left alone.
# Rolling back to the Lua fallback: `scripts/convert.sh 'rl:*' zset` on every
# primary, then unload the module (a server that registered the compact type
# must be restarted without `STORAGE compact`).
# Prints one line per failed key and a summary; exits 1 if any key failed.
set -euo pipefail

cli=(redis-cli)
while [ $# -gt 2 ]; do
    case "$1" in
        -h|-p|-a|-n|--user) cli+=("$1" "$2"); shift 2 ;;
        *) echo "convert.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [ $# -ne 2 ]; then
    echo "usage: scripts/convert.sh [-h host] [-p port] [-a password] [--user user] [-n db] PATTERN zset|compact" >&2
    exit 2
fi
pattern="$1"
case "${2,,}" in
    zset) target=ZSET; source_type=xcloaklog ;;
    compact) target=COMPACT; source_type=zset ;;
    *) echo "convert.sh: the target must be zset or compact (got '$2')" >&2; exit 2 ;;
esac
command -v redis-cli >/dev/null 2>&1 || { echo "convert.sh: redis-cli is needed (apt-get install redis-tools)" >&2; exit 2; }

# Every key of the source form matching the pattern, one per line, through
# SCAN cursor MATCH pattern TYPE t (redis-cli's --scan has no --type before 7.2).
scan() {
    local cursor=0 reply
    while :; do
        mapfile -t reply < <("${cli[@]}" --raw SCAN "$cursor" MATCH "$pattern" TYPE "$source_type" COUNT 500)
        [ ${#reply[@]} -gt 0 ] || { echo "convert.sh: SCAN failed" >&2; return 1; }
        cursor="${reply[0]}"
        case "$cursor" in ''|*[!0-9]*) echo "convert.sh: SCAN failed: ${reply[*]}" >&2; return 1 ;; esac
        [ ${#reply[@]} -gt 1 ] && printf '%s\n' "${reply[@]:1}"
        [ "$cursor" = 0 ] && return 0
    done
}

converted=0 skipped=0 failed=0
while IFS= read -r key; do
    [ -n "$key" ] || continue
    if reply=$("${cli[@]}" --no-raw XCLOAK.CONVERT "$key" "$target" 2>&1); then
        case "$reply" in
            "(integer) 1") converted=$((converted + 1)) ;;
            "(integer) 0") skipped=$((skipped + 1)) ;;
            *) failed=$((failed + 1)); echo "convert.sh: $key: $reply" >&2 ;;
        esac
    else
        failed=$((failed + 1)); echo "convert.sh: $key: $reply" >&2
    fi
done < <(scan)

echo "convert.sh: $converted converted to ${target,,}, $skipped skipped, $failed failed (pattern $pattern)"
[ "$failed" -eq 0 ]
