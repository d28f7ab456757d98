package nethttp

import (
	"testing"

	"github.com/redis/go-redis/v9"

	xcloak "github.com/xcloak/xcloak/clients/go"
)

// mustLimiter is xcloak.NewLimiter for a test's valid options: an error fails the test.
func mustLimiter(t testing.TB, rdb redis.UniversalClient, opt xcloak.Options) *xcloak.Limiter {
	t.Helper()
	l, err := xcloak.NewLimiter(rdb, opt)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mustNew is New for a test's valid options: an error fails the test.
func mustNew(t testing.TB, l *xcloak.Limiter, opt Options) *Middleware {
	t.Helper()
	m, err := New(l, opt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
