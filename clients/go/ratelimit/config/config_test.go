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

// detailed_metric names the counter after the request's values, except for
// an entry matched by a share_threshold wildcard: the values sharing one
// window share one counter, named after the wildcard (the reference's
// GetLimit, shareThresholdMetricKey). Fails when the detailed key writes the
// value there, which also makes a counter per value.
func TestDetailedMetricKeepsTheSharedWildcard(t *testing.T) {
	c, err := Parse(map[string][]byte{"a.yaml": []byte(`
domain: d
descriptors:
  - key: path
    value: "files*"
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
`)}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, value := range []string{"files/a", "files/b"} {
		m := c.Find("d", []Entry{{"path", value}, {"user", "u1"}})
		if m == nil {
			t.Fatalf("%s: no match", value)
		}
		if m.Limit.StatsKey != "d.path_files*.user_u1" || m.Key != "d_path_files*_user_u1" {
			t.Fatalf("%s: stats key %q, window %q; want d.path_files*.user_u1 and d_path_files*_user_u1", value, m.Limit.StatsKey, m.Key)
		}
	}
}

// The configuration is a directory: a file or a missing path given for it
// is refused with its name, never read as an empty configuration (which
// would serve no limit at all). Fails when a file passes as a directory.
func TestLoadDirRefusesWhatIsNotADirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a.yaml")
	if err := os.WriteFile(file, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, filepath.Join(t.TempDir(), "missing")} {
		_, err := LoadDir(path, Options{})
		if e, ok := err.(*Error); !ok || e.File != path {
			t.Fatalf("LoadDir(%s): got %v, want an *Error naming it", path, err)
		}
	}
}
