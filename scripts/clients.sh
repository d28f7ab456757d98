#!/usr/bin/env bash
# Runs one action in every client package under clients/ (docs/clients.md):
#   scripts/clients.sh test         clients/<lang>/test.sh: the package's whole suite
#                                   against real servers it starts (make test-clients)
#   scripts/clients.sh lint         clients/<lang>/lint.sh: the ecosystem's linters and type
#                                   checkers (ruff+mypy, go vet+staticcheck, tsc+eslint,
#                                   clippy, javac -Xlint:all -Werror), failing on
#                                   any finding (make lint)
#   scripts/clients.sh dist DIR     clients/<lang>/dist.sh DIR: its artifact into DIR (make dist)
#   scripts/clients.sh dist-check DIR
#                                   clients/<lang>/dist-check.sh DIR: installs the artifact
#                                   into a clean environment and makes one call (make dist-check)
# CLIENTS="python go" picks packages (default: every one present). Each script
# installs what it needs (pinned) when it is missing, and finds the module in
# $XCLOAK_MODULE (set here to target/release/libxcloak.so unless given) and the
# server in $XCLOAK_SERVER (default redis-server). A summary comes last; the
# exit status is 1 if any package failed.
set -uo pipefail
cd "$(dirname "$0")/.."
action=${1:?usage: scripts/clients.sh test|lint|dist DIR|dist-check DIR}
shift
export XCLOAK_REPO=$PWD
export XCLOAK_MODULE=${XCLOAK_MODULE:-$PWD/target/release/libxcloak.so}
read -r -a want <<< "${CLIENTS:-python go node rust java}"
summary="" failed=0
if [ "$action" = test ]; then
    # The block cache's vectors hold server replies: check that the server still gives them.
    echo "== clients test: block_cache.json against the server"
    if python3 clients/conformance/block_cache.py --check --module "$XCLOAK_MODULE"; then
        summary+=$(printf '%-8s %-8s' vectors passed)$'\n'
    else
        failed=1
        summary+=$(printf '%-8s %-8s' vectors FAILED)$'\n'
    fi
fi
for lang in "${want[@]}"; do
    script=clients/$lang/$action.sh
    if [ ! -f "$script" ]; then
        if [ -d "clients/$lang" ]; then
            echo "== clients $action: clients/$lang has no $action.sh" >&2
            failed=1
            summary+=$(printf '%-8s %-8s' "$lang" "MISSING")$'\n'
        fi
        continue
    fi
    echo "== clients $action: $lang"
    start=$(date +%s)
    if (cd "clients/$lang" && bash "./$action.sh" "$@" </dev/null); then
        status=passed
    else
        status=FAILED
        failed=1
    fi
    summary+=$(printf '%-8s %-8s %4ss' "$lang" "$status" $(( $(date +%s) - start )))$'\n'
done
echo "== clients $action summary"
printf '%s' "${summary:-no client package yet}"$'\n'
exit $failed
