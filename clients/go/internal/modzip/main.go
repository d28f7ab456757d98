// Command modzip writes a module's zip, .mod and .info the way the Go module
// proxy serves them (golang.org/x/mod/zip: the files go mod download
// fetches), and prints the go.sum line of the zip.
//
//	go run . -dir ../.. -path github.com/xcloak/xcloak/clients/go -version v0.1.0 -time 2026-12-01T00:00:00Z -out DIR
//
// It is a module of its own (a nested module is left out of the zip it
// makes), so golang.org/x/mod is not a requirement of the package.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

func main() {
	dir := flag.String("dir", "", "the module's root (its go.mod)")
	path := flag.String("path", "", "module path")
	version := flag.String("version", "", "version, v0.1.0")
	out := flag.String("out", "", "output folder")
	when := flag.String("time", "1970-01-01T00:00:00Z", "the version's time (RFC 3339): the commit's")
	flag.Parse()
	t, err := time.Parse(time.RFC3339, *when)
	if err != nil {
		fmt.Fprintln(os.Stderr, "modzip: -time:", err)
		os.Exit(2)
	}
	if err := run(*dir, *path, *version, *out, t.UTC()); err != nil {
		fmt.Fprintln(os.Stderr, "modzip:", err)
		os.Exit(1)
	}
}

func run(dir, path, version, out string, when time.Time) error {
	mv := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return err
	}
	base := filepath.Join(out, "xcloak-go-"+version)
	f, err := os.Create(base + ".zip")
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(f, mv, dir); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".mod", mod, 0o644); err != nil {
		return err
	}
	// The .info's time is the version's own (the commit's), not the
	// build's: the same commit gives the same files.
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, when})
	if err := os.WriteFile(base+".info", info, 0o644); err != nil {
		return err
	}
	sum, err := dirhash.HashZip(base+".zip", dirhash.Hash1)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", path, version, sum)
	return nil
}
