package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The reference's runtime loader reads every file of the configuration
// directory, whatever its name, and its subdirectories: a ConfigMap whose
// key is "ratelimit" (no extension) or "rules.conf" is loaded there. Loading
// only *.yaml would start this service with no limit at all, silently. Names
// starting with a dot are skipped (a ConfigMap's ..data and its versions, an
// editor's swap file), and a symlink to a directory is not followed. Fails
// when only *.yaml and *.yml files of the directory itself are read.
func TestLoadDirReadsEveryFileAsTheReference(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	domain := func(name string) string {
		return "domain: " + name + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	}
	write("ratelimit", domain("plain"))
	write("rules.conf", domain("conf"))
	write("a.yaml", domain("yaml"))
	write("team/b.yml", domain("nested"))
	write(".hidden.yaml", "not: [yaml")
	write(".v1/c.yaml", "not: [yaml")
	write("target/d.yaml", domain("linked"))
	if err := os.Symlink("target", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	c, err := LoadDir(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(c.Domains(), ","), "conf,linked,nested,plain,yaml"; got != want {
		t.Fatalf("domains %s, want %s (files %v)", got, want, c.Files)
	}
}
