package roce_test

import (
	"errors"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/roce"
)

const (
	rocePath = "github.com/goroce/goroce/roce"
	qpPath   = "github.com/goroce/goroce/internal/qp"
)

// receiveOnly are qp errors that only Engine.Receive returns: the device
// counts them as drops and never hands them to a caller.
var receiveOnly = []string{
	"ErrUnknownQP", "ErrWrongTransport", "ErrBadPKey", "ErrBadQKey",
	"ErrBadHeader", "ErrNotReady", "ErrDropped", "ErrBadAddress",
}

// ownSentinels are errors roce defines itself rather than re-exporting;
// they must match qp's under errors.Is.
var ownSentinels = map[string][2]error{
	"ErrClosed": {roce.ErrClosed, qp.ErrClosed},
}

// roce is the one verbs API, and a user cannot import the engine
// (internal/qp): so every engine type that roce's exported API reaches
// (signatures, struct fields, methods, recursively; SendWR's AHRef, for
// one) has an alias of the same name in roce, every engine constant of such
// a type is re-exported with its name and value, and every engine error a
// verbs call can return is re-exported (or matched by roce's own sentinel).
func TestReexportsComplete(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks roce from source")
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	imp := importer.ForCompiler(token.NewFileSet(), "source", nil).(types.ImporterFrom)
	rp, err := imp.ImportFrom(rocePath, dir, 0)
	if err != nil {
		t.Skipf("type-checking from source: %v", err)
	}
	var qpp *types.Package
	for _, p := range rp.Imports() {
		if p.Path() == qpPath {
			qpp = p
		}
	}
	if qpp == nil {
		t.Fatal("roce does not import qp")
	}

	// Walk roce's exported API and collect the qp named types it reaches.
	reached := map[*types.TypeName]string{} // qp type → where first seen
	seen := map[types.Type]bool{}
	var walk func(typ types.Type, where string)
	walkMethods := func(n *types.Named, where string) {
		for m := range n.Methods() {
			if m.Exported() {
				walk(m.Type(), where+"."+m.Name())
			}
		}
	}
	walk = func(typ types.Type, where string) {
		if seen[typ] {
			return
		}
		seen[typ] = true
		switch t := typ.(type) {
		case *types.Alias:
			walk(types.Unalias(t), where)
		case *types.Named:
			obj := t.Obj()
			if obj.Pkg() == nil || (obj.Pkg().Path() != qpPath && obj.Pkg().Path() != rocePath) {
				return // ib, link, the standard library: not qp's to re-export
			}
			if obj.Pkg().Path() == qpPath {
				if _, ok := reached[obj]; !ok {
					reached[obj] = where
				}
			}
			walk(t.Underlying(), where)
			walkMethods(t, where)
		case *types.Pointer:
			walk(t.Elem(), where)
		case *types.Slice:
			walk(t.Elem(), where)
		case *types.Array:
			walk(t.Elem(), where)
		case *types.Map:
			walk(t.Key(), where)
			walk(t.Elem(), where)
		case *types.Chan:
			walk(t.Elem(), where)
		case *types.Signature:
			for v := range t.Params().Variables() {
				walk(v.Type(), where)
			}
			for v := range t.Results().Variables() {
				walk(v.Type(), where)
			}
		case *types.Struct:
			for f := range t.Fields() {
				if f.Exported() {
					walk(f.Type(), where+"."+f.Name())
				}
			}
		case *types.Interface:
			for m := range t.Methods() {
				if m.Exported() {
					walk(m.Type(), where+"."+m.Name())
				}
			}
		}
	}
	scope := rp.Scope()
	for _, name := range scope.Names() {
		if obj := scope.Lookup(name); obj.Exported() {
			walk(obj.Type(), name)
		}
	}
	// Error types callers unwrap with errors.As count as reached too.
	errIface := types.Universe.Lookup("error").Type().Underlying().(*types.Interface)
	for _, name := range qpp.Scope().Names() {
		if tn, ok := qpp.Scope().Lookup(name).(*types.TypeName); ok && tn.Exported() &&
			types.Implements(types.NewPointer(tn.Type()), errIface) {
			if _, ok := reached[tn]; !ok {
				reached[tn] = "(an error type)"
			}
		}
	}
	if len(reached) < 10 {
		t.Fatalf("only %d qp types reached: the walk is broken", len(reached))
	}

	for tn, where := range reached {
		obj := scope.Lookup(tn.Name())
		if obj == nil || !types.Identical(obj.Type(), tn.Type()) {
			t.Errorf("qp.%s (reached through roce.%s) is not re-exported as roce.%s", tn.Name(), where, tn.Name())
			continue
		}
		// Every constant of the type.
		qs := qpp.Scope()
		for _, name := range qs.Names() {
			c, ok := qs.Lookup(name).(*types.Const)
			if !ok || !c.Exported() || !types.Identical(c.Type(), tn.Type()) {
				continue
			}
			rc, ok := scope.Lookup(name).(*types.Const)
			if !ok || !types.Identical(rc.Type(), c.Type()) || !constEqual(rc, c) {
				t.Errorf("qp.%s (a %s) is not re-exported as roce.%s", name, tn.Name(), name)
			}
		}
	}

	// Errors: every qp error variable but the receive-only ones.
	reexported := reexportedVars(t, dir)
	qs := qpp.Scope()
	errType := types.Universe.Lookup("error").Type()
	for _, name := range qs.Names() {
		v, ok := qs.Lookup(name).(*types.Var)
		if !ok || !v.Exported() || !types.Identical(v.Type(), errType) || slices.Contains(receiveOnly, name) {
			continue
		}
		if pair, ok := ownSentinels[name]; ok {
			if !errors.Is(pair[0], pair[1]) {
				t.Errorf("roce.%s does not match qp.%s", name, name)
			}
			continue
		}
		if reexported[name] != "qp."+name {
			t.Errorf("qp.%s is not re-exported as roce.%s = qp.%s", name, name, name)
		}
	}
	for _, name := range receiveOnly {
		if qs.Lookup(name) == nil {
			t.Errorf("receiveOnly names qp.%s, which no longer exists", name)
		}
	}
}

func constEqual(a, b *types.Const) bool { return a.Val().ExactString() == b.Val().ExactString() }

// reexportedVars maps each package-level variable of roce's source to the
// selector it is initialised with ("qp.ErrBusy"), when it is one.
func reexportedVars(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					if sel, ok := vs.Values[i].(*ast.SelectorExpr); ok {
						if x, ok := sel.X.(*ast.Ident); ok {
							out[n.Name] = x.Name + "." + sel.Sel.Name
						}
					}
				}
			}
		}
	}
	return out
}
