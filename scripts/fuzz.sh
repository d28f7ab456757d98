#!/usr/bin/env bash
# Coverage-guided fuzzing on the STABLE toolchain (no nightly, no cargo-fuzz):
# libFuzzer from the libfuzzer-sys crate (built from its bundled C++ sources),
# and LLVM's SanitizerCoverage enabled with stable rustc flags
# (-Cpasses=sancov-module + -Cllvm-args=-sanitizer-coverage-*), the same
# instrumentation `cargo fuzz build --sanitizer none` passes.
# The RUSTFLAGS apply only to the target (explicit --target), so build
# scripts are not instrumented.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (0 seconds: replay the corpus only)
#   FUZZ_SECONDS=60 make fuzz
# Targets (over the xcloak-core crate, core/): parse_args (args.rs), window (window.rs over an in-memory log),
# decode (log/: RunLog::decode and the log it returns).
# The committed corpus fuzz/corpus/<target>/ seeds each run; new inputs land in
# fuzz/corpus-work/<target>/ (ignored by git; fold them in with
# `release/<target> -merge=1 corpus/<target> corpus-work/<target>`); crashes in
# fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-${FUZZ_SECONDS:-60}}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(parse_args window decode)

command -v c++ >/dev/null 2>&1 || { echo "fuzz: a C++ compiler is needed (apt-get install g++)" >&2; exit 1; }
host="$(rustc -vV | sed -n 's/^host: //p')"

export RUSTFLAGS="${RUSTFLAGS:-} --cfg fuzzing -Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cllvm-args=-sanitizer-coverage-stack-depth \
 -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers"

cargo build --release --target "$host" --bins

for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "corpus-work/$target" "artifacts/$target"
    if [ "$seconds" = 0 ]; then
        # Replay only: every committed input through the invariants, no new inputs.
        echo "fuzz: $target, replaying the corpus"
        dirs=("corpus/$target")
        budget=(-runs=0)
    else
        # New inputs go to corpus-work/ (not committed); the committed corpus seeds the run.
        echo "fuzz: $target for ${seconds}s"
        dirs=("corpus-work/$target" "corpus/$target")
        budget=(-max_total_time="$seconds")
    fi
    "target/$host/release/$target" "${dirs[@]}" \
        "${budget[@]}" -max_len=512 -timeout=10 -rss_limit_mb=1024 \
        -artifact_prefix="artifacts/$target/" -print_final_stats=1 2>&1 \
        | grep -E '^(#[0-9]+.*(INITED|DONE|pulse))|^stat::|ERROR|panicked|Test unit written|^fuzz' || true
    if compgen -G "artifacts/$target/crash-*" >/dev/null; then
        echo "fuzz: $target FOUND A CRASH: $(ls artifacts/$target/crash-*)" >&2
        exit 1
    fi
done
