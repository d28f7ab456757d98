package testserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a primary, its replicas and Sentinels watching them under
// the name MasterName.
type Sentinel struct {
	Primary   *Server
	Replicas  []*Server
	Sentinels []*Server
}

// MasterName is the name the Sentinels know the primary by.
const MasterName = "xcloak"

// StartSentinel starts a primary (cfg), replicas replicas of it and
// sentinels Sentinels (quorum 1, fast failure detection), and returns once
// every Sentinel sees the primary and its replicas.
func StartSentinel(t testing.TB, cfg Config, replicas, sentinels int) *Sentinel {
	t.Helper()
	s := &Sentinel{Primary: Start(t, cfg)}
	for i := 0; i < replicas; i++ {
		r := cfg
		r.Args = append(append([]string{}, cfg.Args...), "--replicaof", "127.0.0.1", fmt.Sprint(s.Primary.Port))
		s.Replicas = append(s.Replicas, Start(t, r))
	}
	for _, r := range s.Replicas {
		if !Eventually(30*time.Second, func() bool {
			return strings.Contains(r.Info("replication"), "master_link_status:up")
		}) {
			t.Fatalf("replica %d never linked:\n%s", r.Port, r.Log())
		}
	}
	for i := 0; i < sentinels; i++ {
		conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\n"+
			"sentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 5000\n"+
			"sentinel parallel-syncs %s 1\n", MasterName, s.Primary.Port, MasterName, MasterName, MasterName)
		srv := startSentinelProcess(t, conf)
		s.Sentinels = append(s.Sentinels, srv)
	}
	for _, sn := range s.Sentinels {
		ok := Eventually(30*time.Second, func() bool {
			c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
			defer c.Close()
			// Each replica known, connected and healthy (flags "slave", link
			// ok): before that a client skips it, and a failover finds none.
			replicas, err := c.Replicas(context.Background(), MasterName).Result()
			if err != nil || len(replicas) != len(s.Replicas) {
				return false
			}
			for _, r := range replicas {
				if r["flags"] != "slave" || r["master-link-status"] != "ok" {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("sentinel %d does not see the primary and its %d replicas:\n%s", sn.Port, len(s.Replicas), sn.Log())
		}
	}
	return s
}

// startSentinelProcess starts one Sentinel with conf as its config file
// (Sentinel rewrites it, so each gets its own).
func startSentinelProcess(t testing.TB, conf string) *Server {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		srv := &Server{Port: FreePort(), config: Config{sentinel: true}, t: t, Dir: t.TempDir()}
		if err := os.WriteFile(filepath.Join(srv.Dir, "sentinel.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if srv.launch() {
			t.Cleanup(srv.Kill)
			return srv
		}
	}
	t.Fatal("no free port for a sentinel after 5 attempts")
	return nil
}

// SentinelAddrs is every Sentinel's address.
func (s *Sentinel) SentinelAddrs() []string {
	var addrs []string
	for _, sn := range s.Sentinels {
		addrs = append(addrs, sn.Addr())
	}
	return addrs
}
