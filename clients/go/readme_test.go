package xcloak

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xcloak/xcloak/clients/go/internal/testserver"
)

// codeBlock is the body of the first fenced block of lang in markdown.
func codeBlock(t *testing.T, markdown, lang string) string {
	t.Helper()
	_, rest, ok := strings.Cut(markdown, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README.md has no ```%s block", lang)
	}
	body, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatalf("README.md: the ```%s block is not closed", lang)
	}
	return body + "\n"
}

// The README's install (its first ```sh block, run as written in a fresh
// module next to a checkout at ../xcloak) and its first example (its first
// ```go block, as main.go, built and run), against a live server with the
// module: three 200s with the IETF headers and "hello, N left", then a 429
// with Retry-After 60. Only the two addresses are replaced (localhost:6379
// by the test server's, localhost:8080 by a free port). Catches an install
// line that does not work from the checkout and an example that does not
// compile or run as written (missing imports, an undefined ctx or w).
func TestReadmeInstallAndFirstExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fresh module")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	install := codeBlock(t, string(readme), "sh")
	example := codeBlock(t, string(readme), "go")
	if !strings.HasPrefix(example, "package main\n") {
		t.Fatalf("the first Go example is not a program:\n%s", example)
	}
	server := testserver.Start(t, testserver.Config{})
	port := testserver.FreePort()
	for _, addr := range []string{"localhost:6379", "localhost:8080"} {
		if !strings.Contains(example, `"`+addr+`"`) {
			t.Fatalf("the first example no longer uses %s", addr)
		}
	}
	example = strings.Replace(example, `"localhost:6379"`, `"`+server.Addr()+`"`, 1)
	example = strings.Replace(example, `"localhost:8080"`, `"127.0.0.1:`+strconv.Itoa(port)+`"`, 1)

	// A fresh module next to the checkout, as the README has it.
	root := t.TempDir()
	checkout, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(checkout, filepath.Join(root, "xcloak")); err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(root, "myapp")
	if err := os.Mkdir(app, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run("bash", "-euc", install)
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	run("go", "build", "-o", "app", ".")

	cmd := exec.Command(filepath.Join(app, "app"))
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cmd.Process.Kill(); <-exited }()
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for { // until it listens, or exits
		conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			conn.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("the example exited:\n%s", logs.String())
		case <-ctx.Done():
			t.Fatalf("the example did not listen:\n%s", logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	for i := 0; i < 4; i++ {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		h := resp.Header
		if h.Get("RateLimit-Policy") != `"3-in-60s";q=3;w=60` {
			t.Errorf("request %d: RateLimit-Policy %q", i, h.Get("RateLimit-Policy"))
		}
		if i < 3 {
			want := "hello, " + strconv.Itoa(2-i) + " left\n"
			if resp.StatusCode != 200 || string(body) != want || h.Get("RateLimit") != `"3-in-60s";r=`+strconv.Itoa(2-i)+";t=60" || h.Get("Retry-After") != "" {
				t.Errorf("request %d: %d %q %v, want 200 %q", i, resp.StatusCode, body, h, want)
			}
			continue
		}
		if resp.StatusCode != 429 || string(body) != "Too Many Requests\n" || h.Get("RateLimit") != `"3-in-60s";r=0;t=60` || h.Get("Retry-After") != "60" {
			t.Errorf("request %d: %d %q %v, want 429 with Retry-After 60", i, resp.StatusCode, body, h)
		}
	}
	if n := server.Do("ZCARD", "rl:ip:127.0.0.1").(int64); n != 3 {
		t.Errorf("the window holds %d entries, want the 3 admissions", n)
	}
}
