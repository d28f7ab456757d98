package xcloak

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"sort"
	"strings"
	"testing"
)

// concepts are the rows of the names table (helpers' names.md, issue 31),
// in order: names.tsv has one line for each.
var concepts = strings.Fields(`Limiter AsyncLimiter Limiter.allow Limiter.peek Limiter.refund Limiter.reset
Limiter.acquire Limiter.allow_all headers Decision MultiDecision TierState AllowAllRequest
Decision.allowed Decision.limit Decision.remaining Decision.retry_after Decision.reset_after
Decision.cost_exceeds_limit Decision.window Decision.tier Decision.tiers Decision.stamp Decision.oldest
Decision.via Decision.error MultiDecision.decisions MultiDecision.binding MultiDecision.rejected
Via.command Via.script Via.error
call.cost call.tiers call.stamp call.now call.oldest call.max_wait
option.prefix option.fallback option.on_error option.timeout option.probe_interval option.durable
option.durable.replicas option.durable.timeout option.replica_reads option.clock
ErrorPolicy.raise ErrorPolicy.allow ErrorPolicy.deny Fallback.auto Fallback.always Fallback.never
headers.style headers.names Style.ietf Style.legacy Style.both
XcloakError UnavailableError NotReplicated
middleware middleware.limit middleware.key middleware.trust_proxies middleware.skip_successful
middleware.skip_failed middleware.request_result
option.block_cache Limiter.stats Stats Stats.cache_hits Stats.cache_entries Via.cache`)

// standardMethods implement the standard library's interfaces (error,
// errors.Is/Unwrap, fmt.Stringer): they are no name of the design.
var standardMethods = map[string]bool{"Error": true, "Unwrap": true, "Is": true}

// exported lists the exported names of the package in dir, as a user writes
// them: "T", "T.Field", "T.Method", "Func", and "Func(param)" for each
// parameter; qualifier ("nethttp.") goes before each.
func exported(t *testing.T, dir, qualifier string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil || len(pkgs) != 1 {
		t.Fatalf("parse %s: %v (%d packages)", dir, err, len(pkgs))
	}
	names := map[string]bool{}
	add := func(name string) { names[qualifier+name] = true }
	params := func(fn string, ft *ast.FuncType) {
		for _, field := range ft.Params.List {
			for _, p := range field.Names {
				add(fn + "(" + p.Name + ")")
			}
		}
	}
	for _, pkg := range pkgs {
		for _, file := range pkg.Files {
			for _, decl := range file.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					name := d.Name.Name
					if d.Recv != nil {
						recv := d.Recv.List[0].Type
						if star, ok := recv.(*ast.StarExpr); ok {
							recv = star.X
						}
						typ := recv.(*ast.Ident)
						if !typ.IsExported() || standardMethods[name] {
							continue
						}
						name = typ.Name + "." + name
					}
					add(name)
					params(name, d.Type)
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.ValueSpec:
							for _, n := range s.Names {
								if n.IsExported() {
									add(n.Name)
								}
							}
						case *ast.TypeSpec:
							if !s.Name.IsExported() {
								continue
							}
							add(s.Name.Name)
							var fields *ast.FieldList
							switch ty := s.Type.(type) {
							case *ast.StructType:
								fields = ty.Fields
							case *ast.InterfaceType:
								fields = ty.Methods
							}
							if fields == nil {
								continue
							}
							for _, f := range fields.List {
								for _, n := range f.Names {
									if n.IsExported() {
										add(s.Name.Name + "." + n.Name)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return names
}

// names.tsv (the package's row of the names table in docs/clients.md)
// against the exported API of the package, of nethttp and of ulule, both
// ways: every name the file gives exists (a rename without the table
// fails), and every exported name, parameter names aside, is in the file (a
// new name without its row fails). Rows are the concepts, in order; a "-"
// needs a note saying why.
func TestNamesTable(t *testing.T) {
	data, err := os.ReadFile("names.tsv")
	if err != nil {
		t.Fatal(err)
	}
	api := exported(t, ".", "")
	for name := range exported(t, "nethttp", "nethttp.") {
		api[name] = true
	}
	for name := range exported(t, "ulule", "ulule.") {
		api[name] = true
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if lines[0] != "concept\tname\tnote" {
		t.Fatalf("header %q", lines[0])
	}
	if len(lines)-1 != len(concepts) {
		t.Errorf("%d rows, want one per concept (%d)", len(lines)-1, len(concepts))
	}
	listed := map[string]bool{}
	for i, line := range lines[1:] {
		cols := strings.Split(line, "\t")
		if len(cols) != 3 {
			t.Errorf("line %d: %d columns: %q", i+2, len(cols), line)
			continue
		}
		if i < len(concepts) && cols[0] != concepts[i] {
			t.Errorf("line %d: concept %q, want %q", i+2, cols[0], concepts[i])
		}
		if cols[1] == "-" {
			if cols[2] == "" {
				t.Errorf("%s: no name and no note saying why", cols[0])
			}
			continue
		}
		for _, name := range strings.Split(cols[1], ", ") {
			if !api[name] {
				t.Errorf("%s: %s is not in the package's exported API", cols[0], name)
			}
			listed[name] = true
		}
	}
	var missing []string
	for name := range api {
		if !listed[name] && !strings.Contains(name, "(") {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported but not in names.tsv: %s", strings.Join(missing, ", "))
	}
}
