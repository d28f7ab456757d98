package testserver

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a real Redis Cluster on loopback, built the way operators build
// one: cluster-enabled nodes joined by redis-cli --cluster create.
type Cluster struct {
	Nodes []*Server
	t     testing.TB
}

// StartCluster starts len(configs) primaries (node i with configs[i], >= 3)
// with replicas replicas each (the config of their primary), and returns once
// every node reports cluster_state:ok and every replica is linked.
func StartCluster(t testing.TB, configs []Config, replicas int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	all := append([]Config{}, configs...)
	for r := 0; r < replicas; r++ {
		all = append(all, configs...)
	}
	for _, cfg := range all {
		cfg.Args = append(append([]string{}, cfg.Args...),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "15000")
		c.Nodes = append(c.Nodes, Start(t, cfg))
	}
	// redis-cli makes the first len(configs) nodes primaries and gives
	// replicas in turn; its pairing is its own, so each replica is moved to
	// the primary of the same config with CLUSTER REPLICATE afterwards.
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes[:len(configs)] {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	c.cli(args...)
	for i, n := range c.Nodes[len(configs):] {
		primary := c.Nodes[i%len(configs)]
		n.Do("CLUSTER", "MEET", "127.0.0.1", primary.Port)
	}
	for i, n := range c.Nodes[len(configs):] {
		primary := c.Nodes[i%len(configs)]
		id := primary.Do("CLUSTER", "MYID").(string)
		ok := Eventually(30*time.Second, func() bool {
			cl := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
			defer cl.Close()
			return cl.Do(context.Background(), "CLUSTER", "REPLICATE", id).Err() == nil
		})
		if !ok {
			t.Fatalf("CLUSTER REPLICATE %s on %d never succeeded", id, n.Port)
		}
	}
	c.WaitOK()
	return c
}

func (c *Cluster) cli(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary("XCLOAK_REDIS_CLI", "redis-cli"), args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// Addrs is every node's address.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr())
	}
	return addrs
}

// WaitOK waits until every node reports cluster_state:ok with all slots,
// every replica is linked, and every node lists every replica in CLUSTER
// SLOTS (a client reads its replicas from there).
func (c *Cluster) WaitOK() {
	c.t.Helper()
	total := strconv.Itoa(len(c.Nodes))
	for _, n := range c.Nodes {
		ok := Eventually(60*time.Second, func() bool {
			cl := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
			defer cl.Close()
			ctx := context.Background()
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil || Field(info, "cluster_state") != "ok" || Field(info, "cluster_slots_assigned") != "16384" ||
				Field(info, "cluster_known_nodes") != total {
				return false
			}
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil || (strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up")) {
				return false
			}
			// CLUSTER SLOTS lists a node once it serves its slots (SHARDS lists
			// every node it knows of): that is what this wait is for.
			//lint:ignore SA1019 CLUSTER SLOTS, not SHARDS, says a node serves its slots
			slots, err := cl.ClusterSlots(ctx).Result()
			if err != nil {
				return false
			}
			listed := 0
			for _, s := range slots {
				listed += len(s.Nodes)
			}
			return listed == len(c.Nodes)
		})
		if !ok {
			c.t.Fatalf("cluster node %d not ready:\n%s", n.Port, n.Log())
		}
	}
}

// Primaries and Replicas are the nodes by their current role.
func (c *Cluster) Primaries() []*Server { return c.byRole("master") }
func (c *Cluster) Replicas() []*Server  { return c.byRole("slave") }

func (c *Cluster) byRole(role string) []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		if strings.Contains(n.Info("replication"), "role:"+role) {
			out = append(out, n)
		}
	}
	return out
}

// Owner is the primary serving key's slot.
func (c *Cluster) Owner(key string) *Server {
	c.t.Helper()
	slot := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key).(int64)
	for _, n := range c.Primaries() {
		for _, line := range strings.Split(n.Do("CLUSTER", "NODES").(string), "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "myself") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, _ := strings.Cut(r, "-")
				a, _ := strconv.ParseInt(lo, 10, 64)
				b := a
				if hi != "" {
					b, _ = strconv.ParseInt(hi, 10, 64)
				}
				if slot >= a && slot <= b {
					return n
				}
			}
		}
	}
	c.t.Fatalf("no primary serves slot %d", slot)
	return nil
}

// Sum is a counter summed over nodes (see Server.Stat).
func Sum(nodes []*Server, section, line, field string) int64 {
	var total int64
	for _, n := range nodes {
		total += n.Stat(section, line, field)
	}
	return total
}

// ResetStats is CONFIG RESETSTAT on every node.
func (c *Cluster) ResetStats() {
	for _, n := range c.Nodes {
		n.ResetStats()
	}
}

// String lists the nodes, for failure messages.
func (c *Cluster) String() string {
	var parts []string
	for _, n := range c.Nodes {
		parts = append(parts, fmt.Sprint(n.Port))
	}
	return strings.Join(parts, ",")
}
