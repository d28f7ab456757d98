#!/usr/bin/env bash
# make lint: every gate, each run even when one before it failed; a summary
# at the end, exit status 1 if any failed.
#   clippy   cargo clippy --workspace --all-targets --all-features -- -D warnings
#   fmt      cargo fmt --all --check, and the fuzz crate's (its own workspace)
#   miri     cargo +nightly miri test -p xcloak-core --lib MIRI_TESTS: every
#            unit test of the core crate (MIRI_TESTS empty, the default; a
#            filter picks some), under Stacked Borrows and again under Tree
#            Borrows (MIRIFLAGS=-Zmiri-tree-borrows). The tests take smaller
#            sizes under cfg(miri) (Miri interprets some 10,000 times slower
#            than native code), the same boundaries. --lib: the crate has no
#            doc tests, and rustdoc under Miri costs seconds for none. Miri runs
#            on one core, so the two models run side by side, Tree Borrows in
#            its own target dir (target/miri-tree-borrows; cargo holds a target
#            dir's lock while its tests run), each log printed whole. Skipped,
#            loudly, while the workspace has no package xcloak-core.
#   clients  scripts/clients.sh lint: each clients/<lang>/lint.sh (a package
#            without one is MISSING and fails)
#   names    clients/conformance/names.py --check: every package's names.tsv
#            names every concept, and docs/clients.md's table is the generated one
#   docs     python3 -m scripts.bench.check_docs: every figure quoted in the docs
#            equals the run of record (docs/performance.json); and the bench
#            package's own unit tests
# LINT_ONLY=PREFIX runs only the gates whose name starts with it (make miri).
# scripts/ensure-deps.sh rust-lint installs clippy, rustfmt and nightly Miri first.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
summary="" failed=0

gate() {
    local name=$1; shift
    # LINT_ONLY=miri (make miri) runs only the gates whose name starts so.
    [[ $name == "${LINT_ONLY:-}"* ]] || return 0
    echo "== lint: $name: $*"
    local start=$SECONDS status
    if "$@"; then status=passed; else status=FAILED; failed=1; fi
    summary+=$(printf '%-22s %-7s %4ss' "$name" "$status" $(( SECONDS - start )))$'\n'
}

# A gate started in the background (gate_start NAME CMD...), its log and
# status collected by gate_wait NAME, in the order of the waits.
declare -A bg_pid=() bg_start=() bg_log=()
gate_start() {
    local name=$1; shift
    [[ $name == "${LINT_ONLY:-}"* ]] || return 0
    bg_log[$name]=$(mktemp)
    bg_start[$name]=$SECONDS
    echo "== lint: $name (started, beside the next): $*"
    "$@" >"${bg_log[$name]}" 2>&1 &
    bg_pid[$name]=$!
}
gate_wait() {
    local name=$1 status
    [ -n "${bg_pid[$name]:-}" ] || return 0
    if wait "${bg_pid[$name]}"; then status=passed; else status=FAILED; failed=1; fi
    echo "== lint: $name, its output"
    cat "${bg_log[$name]}"
    rm -f "${bg_log[$name]}"
    summary+=$(printf '%-22s %-7s %4ss' "$name" "$status" $(( SECONDS - bg_start[$name] )))$'\n'
}

# A workspace package named xcloak-core. Its id is "path+file:///DIR#xcloak-core@V",
# or "path+file:///.../xcloak-core#V" when its folder has the package's name.
has_core() {
    $CARGO metadata --format-version 1 --no-deps 2>/dev/null \
        | grep -qE '"id":"path\+file://[^"]*(#xcloak-core@|/xcloak-core#)'
}

gate clippy $CARGO clippy --workspace --all-targets --all-features -- -D warnings
gate fmt $CARGO fmt --all --check
gate "fmt (fuzz)" bash -c "cd fuzz && $CARGO fmt --check"
if has_core; then
    read -r -a miri_tests <<< "${MIRI_TESTS-}"
    gate_start "miri (tree borrows)" env MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-tree-borrows" \
        $CARGO +nightly miri test -p xcloak-core --lib --target-dir target/miri-tree-borrows "${miri_tests[@]}"
    gate "miri (stacked borrows)" $CARGO +nightly miri test -p xcloak-core --lib "${miri_tests[@]}"
    gate_wait "miri (tree borrows)"
else
    echo "######################################################################" >&2
    echo "## lint: MIRI SKIPPED: the workspace has no package xcloak-core yet  ##" >&2
    echo "## (cargo metadata); it arrives with the core crate. Not a pass.     ##" >&2
    echo "######################################################################" >&2
    summary+=$(printf '%-22s %-7s' "miri" "SKIPPED (no package xcloak-core)")$'\n'
fi
gate clients scripts/clients.sh lint
gate names python3 clients/conformance/names.py --check
gate "docs figures" python3 -m scripts.bench.check_docs
gate "bench unit tests" python3 -m unittest scripts.bench.test_check_docs scripts.bench.test_targets

echo "== lint summary"
printf '%s' "$summary"
exit $failed
