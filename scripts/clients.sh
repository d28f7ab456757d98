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
#
# `test` runs the packages in two lanes at once (CLIENTS_LANES, default
# "go node|python java rust": each lane's packages in turn, the lanes side by
# side). A suite waits on its servers about half its time, so two lanes fill
# the two cores of the CI machine, a package that compiles (Go, Java, Rust)
# beside one that mostly waits. Each package's output is printed whole when it
# ends. CLIENTS_LANES=1 runs them one after the other (the default of the
# other actions).
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
# One package: its script, its output to the file $2 (- for stdout), its status line to the file $3.
run_one() {
    local lang=$1 out=$2 line=$3 script=clients/$1/$action.sh status start=$SECONDS
    if [ ! -f "$script" ]; then
        [ -d "clients/$lang" ] || return 0
        echo "== clients $action: clients/$lang has no $action.sh" >&2
        printf '%-8s %-8s\n' "$lang" MISSING >"$line"
        return 0
    fi
    echo "== clients $action: $lang"
    if [ "$out" = - ]; then
        (cd "clients/$lang" && bash "./$action.sh" "${args[@]}" </dev/null)
    else
        (cd "clients/$lang" && bash "./$action.sh" "${args[@]}" </dev/null) >"$out" 2>&1
    fi
    if [ $? -eq 0 ]; then
        status=passed
    else
        status=FAILED
    fi
    printf '%-8s %-8s %4ss\n' "$lang" "$status" $(( SECONDS - start )) >"$line"
}
args=("$@")
lanes=${CLIENTS_LANES:-1}
[ "$action" = test ] && lanes=${CLIENTS_LANES:-go node|python java rust}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$lanes" = 1 ]; then
    for lang in "${want[@]}"; do run_one "$lang" - "$work/$lang.status"; done
else
    # A package asked for but in no lane gets a last lane.
    declare -A wanted=() placed=()
    for lang in "${want[@]}"; do wanted[$lang]=1; done
    pids=()
    IFS='|' read -r -a lane_specs <<< "$lanes"
    for spec in "${lane_specs[@]}" "${want[*]}"; do
        lane=()
        for lang in $spec; do
            if [ -n "${wanted[$lang]:-}" ] && [ -z "${placed[$lang]:-}" ]; then
                lane+=("$lang")
                placed[$lang]=1
            fi
        done
        [ ${#lane[@]} -gt 0 ] || continue
        (
            for lang in "${lane[@]}"; do
                run_one "$lang" "$work/$lang.out" "$work/$lang.status"
                # One package's output at a time, whole.
                flock "$work/print.lock" bash -c 'echo "== clients $1: $2, its output"; cat "$3" 2>/dev/null' \
                    _ "$action" "$lang" "$work/$lang.out"
            done
        ) &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
fi
for lang in "${want[@]}"; do
    [ -f "$work/$lang.status" ] || continue
    summary+=$(cat "$work/$lang.status")$'\n'
    grep -q passed "$work/$lang.status" || failed=1
done
echo "== clients $action summary"
printf '%s' "${summary:-no client package yet}"$'\n'
exit $failed
