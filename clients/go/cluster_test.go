package xcloak

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

const (
	clusterKeys  = 300
	clusterLimit = 3
)

// fillWindows sends clusterLimit+1 rounds of Allow over clusterKeys keys
// and returns how many were admitted and who answered.
func fillWindows(t *testing.T, l *Limiter, prefix string) (admitted int, vias map[Via]int) {
	t.Helper()
	ctx := context.Background()
	vias = map[Via]int{}
	for round := 0; round <= clusterLimit; round++ {
		for k := 0; k < clusterKeys; k++ {
			r, err := l.Allow(ctx, fmt.Sprintf("%s:%d", prefix, k), 10*time.Minute, clusterLimit)
			if err != nil {
				t.Fatalf("%s:%d round %d: %v", prefix, k, round, err)
			}
			if r.Allowed {
				admitted++
			}
			vias[r.Via]++
		}
	}
	return admitted, vias
}

// Against a 3+3 cluster with the module, through the command and through
// the script: every call goes straight to its key's node (0 MOVED, summed
// over the six nodes' INFO errorstats), the admissions are exact, and with
// ReadOnly every PEEK is answered by a replica (RouteRandomly: by replicas
// and primaries; RouteByLatency: by the closest node). In durable mode WAIT
// goes to the key's node, right after the call. Catches: routing by the
// script's SHA (every EVALSHA to one slot: MOVED), PEEK not marked
// read-only, WAIT sent to a random node.
func TestClusterGoesStraightToTheKeysNode(t *testing.T) {
	cluster := testserver.StartCluster(t, []testserver.Config{{}, {}, {}}, 1)
	primaries, replicas := cluster.Primaries(), cluster.Replicas()
	if len(primaries) != 3 || len(replicas) != 3 {
		t.Fatalf("%d primaries, %d replicas", len(primaries), len(replicas))
	}
	ctx := context.Background()
	for _, fallback := range []Fallback{FallbackNever, FallbackAlways} {
		name := map[Fallback]string{FallbackNever: "command", FallbackAlways: "script"}[fallback]
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()[:1]})
		l := mustLimiter(t, rdb, Options{Fallback: fallback, Prefix: "rl:" + name + ":"})
		cluster.ResetStats()
		admitted, vias := fillWindows(t, l, "user")
		if admitted != clusterKeys*clusterLimit || vias[Via(name)] != clusterKeys*(clusterLimit+1) {
			t.Errorf("%s: %d admitted (want %d), answered by %v", name, admitted, clusterKeys*clusterLimit, vias)
		}
		if moved := testserver.Sum(cluster.Nodes, "errorstats", "errorstat_MOVED", "count"); moved != 0 {
			t.Errorf("%s: %d MOVED", name, moved)
		}
		command := map[Fallback]string{FallbackNever: "xcloak.allow", FallbackAlways: "evalsha"}[fallback]
		perPrimary := []int64{}
		for _, p := range primaries {
			perPrimary = append(perPrimary, p.Calls(command))
		}
		var total int64
		for _, n := range perPrimary {
			total += n
			if n == 0 {
				t.Errorf("%s: a primary served no call: %v", name, perPrimary)
			}
		}
		if total != clusterKeys*(clusterLimit+1) {
			t.Errorf("%s: %d calls of %s on the primaries %v", name, total, command, perPrimary)
		}
		t.Logf("%s: %d of %d admitted, 0 MOVED, calls per primary %v", name, admitted, clusterKeys*(clusterLimit+1), perPrimary)
		rdb.Close()
	}

	// PEEK with replica reads, after the replicas have caught up.
	for _, p := range primaries {
		p.Do("WAIT", 1, 5000)
	}
	peekCommand := "xcloak.peek"
	for _, read := range []struct {
		name     string
		opt      redis.ClusterOptions
		only     bool // every PEEK on a replica
		replicas bool // some PEEKs on replicas
	}{
		{"ReadOnly", redis.ClusterOptions{ReadOnly: true}, true, true},
		{"RouteRandomly", redis.ClusterOptions{RouteRandomly: true}, false, true},
		// The closest node by go-redis's own PING measure, a primary or a
		// replica: on loopback the figures are a toss-up.
		{"RouteByLatency", redis.ClusterOptions{RouteByLatency: true}, false, false},
	} {
		for _, fallback := range []Fallback{FallbackNever, FallbackAlways} {
			opt := read.opt
			opt.Addrs = cluster.Addrs()[:1]
			rdb := redis.NewClusterClient(&opt)
			l := mustLimiter(t, rdb, Options{Fallback: fallback, Prefix: "rl:command:"})
			if fallback == FallbackAlways {
				peekCommand = "evalsha_ro"
				if major, _ := testserver.Version(); major < 7 {
					peekCommand = "evalsha"
				}
			} else {
				peekCommand = "xcloak.peek"
			}
			cluster.ResetStats()
			for k := 0; k < clusterKeys; k++ {
				r, err := l.Peek(ctx, fmt.Sprintf("user:%d", k), 10*time.Minute, clusterLimit)
				if err != nil || r.Allowed || r.Remaining != 0 {
					t.Fatalf("%s peek user:%d: %+v, %v", read.name, k, r, err)
				}
			}
			onReplicas := testserver.Sum(replicas, "commandstats", "cmdstat_"+peekCommand, "calls")
			onPrimaries := testserver.Sum(primaries, "commandstats", "cmdstat_"+peekCommand, "calls")
			moved := testserver.Sum(cluster.Nodes, "errorstats", "errorstat_MOVED", "count")
			t.Logf("%s via %s: %d PEEKs on replicas, %d on primaries, %d MOVED", read.name, peekCommand, onReplicas, onPrimaries, moved)
			if moved != 0 || onReplicas+onPrimaries != clusterKeys || (read.replicas && onReplicas == 0) || (read.only && onPrimaries != 0) {
				t.Errorf("%s via %s: %d on replicas, %d on primaries, %d MOVED", read.name, peekCommand, onReplicas, onPrimaries, moved)
			}
			rdb.Close()
		}
	}

	// Durable: WAIT 1 on the key's node, after the admission's reply.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()[:1]})
	defer rdb.Close()
	l := mustLimiter(t, rdb, Options{Durable: &Durable{Replicas: 1, Timeout: 2 * time.Second}, Prefix: "rl:durable:"})
	cluster.ResetStats()
	for k := 0; k < 30; k++ {
		r, err := l.Allow(ctx, fmt.Sprintf("user:%d", k), time.Minute, 1)
		if err != nil || !r.Allowed || r.Via != ViaCommand {
			t.Fatalf("durable user:%d: %+v, %v", k, r, err)
		}
	}
	for _, p := range primaries {
		if a, w := p.Calls("xcloak.allow"), p.Calls("wait"); a != w || a == 0 {
			t.Errorf("primary %d: %d calls, %d WAITs", p.Port, a, w)
		}
	}
	// Two replicas asked, one exists: not replicated. Under deny the
	// admission is refunded; the window holds nothing.
	l = mustLimiter(t, rdb, Options{Durable: &Durable{Replicas: 2, Timeout: 100 * time.Millisecond}, OnError: PolicyDeny, Prefix: "rl:durable:"})
	r, err := l.Allow(ctx, "lonely", time.Minute, 5)
	if err != nil || r.Allowed || r.Via != ViaError || r.Err == nil {
		t.Fatalf("not replicated under deny: %+v, %v", r, err)
	}
	if n := cluster.Owner("rl:durable:lonely").Do("EXISTS", "rl:durable:lonely").(int64); n != 0 {
		t.Errorf("the refused admission is still in the window")
	}
}

// A cluster whose third primary has no module: the choice is per node.
// Its keys go through the script, the others through the command, every
// admission exact; after MODULE LOAD on it, the next probe moves it over.
func TestClusterFallbackIsPerNode(t *testing.T) {
	cluster := testserver.StartCluster(t, []testserver.Config{{}, {}, {NoModule: true, Args: moduleCommandArgs()}}, 0)
	bare := cluster.Nodes[2]
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()[:1]})
	defer rdb.Close()
	l := mustLimiter(t, rdb, Options{ProbeInterval: 500 * time.Millisecond})
	ctx := context.Background()
	cluster.ResetStats()
	for k := 0; k < 60; k++ {
		key := fmt.Sprintf("user:%d", k)
		want := ViaCommand
		if cluster.Owner(key) == bare {
			want = ViaScript
		}
		for round := 0; round < 2; round++ {
			r, err := l.Allow(ctx, key, time.Minute, 1)
			if err != nil || r.Allowed != (round == 0) || r.Via != want {
				t.Fatalf("%s round %d: %+v, %v (want via %s)", key, round, r, err, want)
			}
		}
	}
	if n := bare.Calls("xcloak.allow"); n != 0 {
		t.Errorf("the node without the module ran XCLOAK.ALLOW %d times", n)
	}
	if bare.Calls("evalsha") == 0 || cluster.Nodes[0].Calls("evalsha")+cluster.Nodes[1].Calls("evalsha") != 0 {
		t.Errorf("EVALSHA: %d on the bare node, %d and %d on the others", bare.Calls("evalsha"), cluster.Nodes[0].Calls("evalsha"), cluster.Nodes[1].Calls("evalsha"))
	}
	if moved := testserver.Sum(cluster.Nodes, "errorstats", "errorstat_MOVED", "count"); moved != 0 {
		t.Errorf("%d MOVED", moved)
	}

	bare.Do("MODULE", "LOAD", testserver.Module())
	time.Sleep(600 * time.Millisecond)
	for k := 0; k < 60; k++ {
		key := fmt.Sprintf("user:%d", k)
		r, err := l.Peek(ctx, key, time.Minute, 1)
		if err != nil || r.Via != ViaCommand || r.Allowed {
			t.Fatalf("%s after MODULE LOAD: %+v, %v", key, r, err)
		}
	}
}
