# xcloak: `make run` serves the module on a local Redis, `make test` runs the suite.
# Every target installs what it needs (scripts/ensure-deps.sh) when it is missing.

SHELL   := /bin/bash
PORT    ?= 6379
CARGO   ?= cargo
MODULE  := target/release/libxcloak.so

.PHONY: deps build run test unit clean

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
test: build
	$(CARGO) test -- --test-threads=2

unit:
	$(CARGO) test --lib

clean:
	$(CARGO) clean
