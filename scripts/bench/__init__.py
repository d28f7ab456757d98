"""`make bench`: what xcloak costs, measured side by side with what it replaces.

`python3 -m scripts.bench` runs every section, checks the targets
(scripts/bench/targets.toml) and writes docs/performance.md,
docs/performance.json, the README's table and docs/performance-memory.png;
`python3 -m scripts.bench SECTION...` runs some sections and prints them
(docs untouched); `--update SECTION...` replaces those sections in the run of
record, `--render` writes the docs again from it. Modules, each importing only
modules above it in this list:

  resp        a RESP client (also scripts/fixtures.py's)
  server      a fresh redis-server: start, stop, counters, redis-cli --pipe
  deps        what is fetched into ~/.cache/xcloak-bench: redis-cell, limits' wheel, matplotlib
  callgrind   instruction counts of a server under valgrind
  workloads   redis-benchmark mixes, streams with NOW, prefills
  sections/   commands, entries, memory, refund, fallback: each returns data
  compare     builds against each other (python3 -m scripts.bench.compare); beside it
              callgrind_commands, callgrind_refund, callgrind_cache: instruction counts
  results     the result data as flat keys (docs/performance.json)
  targets     targets.toml read and checked against the data
  report      docs/performance.md and the README's table from the data
  check_docs  figures quoted in the docs against the data (no server)
"""
