package xcloak

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// mustLimiter is NewLimiter for a test's valid options: an error fails the test.
func mustLimiter(t testing.TB, rdb redis.UniversalClient, opt Options) *Limiter {
	t.Helper()
	l, err := NewLimiter(rdb, opt)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
