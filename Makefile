# xcloak: `make run` serves the module on a local Redis, `make test` runs the suite.
# Every target installs what it needs (scripts/ensure-deps.sh) when it is missing.

SHELL   := /bin/bash
PORT    ?= 6379
CARGO   ?= cargo
MODULE  := target/release/libxcloak.so

.PHONY: deps build run test unit clean fault-module fuzz example-deps

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

# The whole suite: unit tests, then integration tests against real servers.
test: build fault-module
	$(CARGO) test -- --test-threads=2

# A dev build with the test-only `fault-injection` feature, for tests/panic_safety.rs
# (copied aside: a plain `cargo test` rebuilds target/debug/libxcloak.so without it).
FAULT_MODULE := target/fault/libxcloak.so
fault-module: deps
	$(CARGO) build --features fault-injection
	@mkdir -p target/fault && cp target/debug/libxcloak.so $(FAULT_MODULE)

# Coverage-guided fuzzing on stable Rust (libFuzzer + SanitizerCoverage flags, see
# docs/hardening.md); not part of `make test`. FUZZ_SECONDS per target (default 60).
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/ensure-deps.sh g++
	scripts/fuzz.sh $(FUZZ_SECONDS)

unit:
	$(CARGO) test --lib

# Python (redis-py) and Node (node-redis) deps of docs/examples/, into their
# git-ignored folders; tests/examples.rs runs this itself when they are missing.
example-deps:
	@scripts/example-deps.sh

clean:
	$(CARGO) clean
