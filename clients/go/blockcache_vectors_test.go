package xcloak

// Every case of clients/conformance/block_cache.json through the block
// cache's pure core, on a virtual monotonic clock (no server): a "sent"
// allow must miss and its reply is recorded as sent at "at"; an unsent one
// must hit and give exactly the case's decision and headers; "forget" is
// what Refund and Reset do; "size" counts the entries held.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

type blockCacheFile struct {
	Schema int `json:"schema"`
	Cases  []struct {
		Name     string `json:"name"`
		Capacity int    `json:"capacity"`
		Steps    []struct {
			Op       string          `json:"op"`
			At       json.Number     `json:"at"`
			Key      string          `json:"key"`
			Window   json.Number     `json:"window"`
			Limit    json.Number     `json:"limit"`
			Tiers    [][]json.Number `json:"tiers"`
			Cost     *json.Number    `json:"cost"`
			Sent     bool            `json:"sent"`
			Reply    interface{}     `json:"reply"`
			Decision *struct {
				vectorDecision
				Via string `json:"via"`
			} `json:"decision"`
			Headers map[string]map[string]string `json:"headers"`
			Entries int                          `json:"entries"`
		} `json:"steps"`
	} `json:"cases"`
}

func TestBlockCacheVectors(t *testing.T) {
	path := filepath.Join(testserver.Repo(), "clients/conformance/block_cache.json")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.UseNumber()
	var v blockCacheFile
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if v.Schema != 1 || len(v.Cases) == 0 {
		t.Fatalf("%s: schema %d, %d cases", path, v.Schema, len(v.Cases))
	}
	steps := 0
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cache, at := virtualCache(c.Capacity)
			for i, s := range c.Steps {
				where := fmt.Sprintf("step %d (%s at %s)", i, s.Op, s.At)
				ms, err := s.At.Float64()
				if err != nil {
					t.Fatalf("%s: at %q", where, s.At)
				}
				*at = ms
				steps++
				switch s.Op {
				case "allow":
					sh := shape{windowMs: num(s.Window), limit: int(num(s.Limit)), cost: 1}
					for _, tr := range s.Tiers {
						sh.tiers = append(sh.tiers, tierArg{windowMs: num(tr[0]), limit: int(num(tr[1]))})
					}
					if s.Cost != nil {
						sh.cost = int(num(*s.Cost))
					}
					got, tk, hit := cache.lookup(s.Key, sh)
					if s.Sent {
						if hit {
							t.Fatalf("%s: a hit (%+v), want a miss", where, got)
						}
						d, err := parseDecision(goReply(s.Reply), sh.windowMs, len(sh.tiers) > 0, false, false)
						if err != nil {
							t.Fatalf("%s: %v", where, err)
						}
						d.Via = ViaCommand
						cache.record(s.Key, sh, tk, d)
						continue
					}
					if !hit {
						t.Fatalf("%s: a miss, want a hit", where)
					}
					if s.Decision == nil || s.Decision.Via != "cache" || got.Via != ViaCache {
						t.Fatalf("%s: via %q, the case's %+v", where, got.Via, s.Decision)
					}
					checkDecision(t, where, got, s.Decision.vectorDecision)
					if got.Oldest != -1 || got.Err != nil {
						t.Errorf("%s: oldest %d, err %v; want none", where, got.Oldest, got.Err)
					}
					for style, want := range s.Headers {
						checkHeaders(t, where+" "+style, got.Headers(Style(style)), want)
					}
				case "forget":
					cache.forget(s.Key)
				case "size":
					if n := cache.stats().CacheEntries; n != s.Entries {
						t.Errorf("%s: %d entries, want %d", where, n, s.Entries)
					}
				default:
					t.Fatalf("%s: unknown op", where)
				}
			}
		})
	}
	t.Logf("%d cases, %d steps", len(v.Cases), steps)
}
