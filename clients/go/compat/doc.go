// Package compat holds tests that run xcloak beside the libraries it is
// compared with (go-redis/redis_rate), in a module of its own so that they
// are no requirement of the xcloak package. clients/go/test.sh runs them.
package compat
