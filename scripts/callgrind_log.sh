#!/bin/bash
# Instructions per XCLOAK.ALLOW decision over the compact log alone (trim +
# count + record through window::admit on a RunLog, no server), for windows
# held at N entries as scripts/bench/compare.py's streams hold them: each call trims
# one entry and adds one (or, with REJECT=1, finds the window full). A quick,
# repeatable companion of compare.py --instructions for work on the log
# (core/src/log/; needs valgrind). It runs core/examples/stream_bench.rs.
#
# Usage: scripts/callgrind_log.sh [SIZE...]      (default 10 1000 100000; CALLS=2000 per key, 2 keys)
#        REFUND=1 scripts/callgrind_log.sh [SIZE...]   RunLog::remove_at of a middle stamp (each put
#        back by a step back), as scripts/bench/callgrind_refund.py's "middle" on a server
#        STREAM_BENCH=path/to/stream_bench scripts/callgrind_log.sh   measures that build instead
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${STREAM_BENCH:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet -p xcloak-core --example stream_bench
  bin=${CARGO_TARGET_DIR:-target}/release/examples/stream_bench
fi
[ -x "$bin" ] || { echo "no stream_bench at $bin" >&2; exit 1; }
calls=${CALLS:-2000}
for size in "${@:-10 1000 100000}"; do
  for each in $size; do
    out=$(mktemp -d)
    if [ -n "${REFUND:-}" ]; then mode=refund fn='*stream_bench*refund_measure*' per=$calls what="middle refunds"
    else mode=admit fn='*stream_bench*measure*' per=$((2 * calls)) what=$([ -n "${REJECT:-}" ] && echo rejections || echo admissions); fi
    SIZE=$each CALLS=$calls valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
      --toggle-collect="$fn" "$bin" "$mode" >/dev/null 2>"$out/err" || { cat "$out/err" >&2; exit 1; }
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$out/cg")
    printf '%8s entries, %s: %s instructions per call\n' "$each" "$what" "$(python3 -c "print('%.1f' % ($total / $per))")"
    rm -rf "$out"
  done
done
