package layering

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/goroce/goroce"

// layers maps a path prefix (relative to the module) to its layer; the
// longest matching prefix wins.
var layers = map[string]string{
	"ib": "ib",
	// The transport engine: package roce is its public face (docs/ARCHITECTURE.md).
	"internal/qp":        "qp",
	"roce":               "roce",
	"link":               "link",
	"link/memlink":       "link",
	"link/udplink":       "linkimpl",
	"link/xdplink":       "linkimpl",
	"netdev":             "device-addon",
	"rocemetrics":        "device-addon",
	"cm":                 "cm",
	"cm/rping":           "protocol",
	"rsocket":            "protocol",
	"naaice":             "protocol",
	"fpga":               "protocol",
	"cuobj":              "protocol",
	"xdp":                "kernel",
	"bpf":                "kernel",
	"internal/sys":       "kernel",
	"link/faultnet":      "support",
	"internal/netnstest": "support",
	"internal/pcaptest":  "support",
	"internal/layering":  "support",
	"internal/cliflag":   "support",
	// The shared closed error sits under every layer, the kernel's included.
	"internal/errclosed": "base",
	// So does the shared timeout error.
	"internal/errtimeout": "base",
	// The link layer's frame errors, shared by link and its implementations.
	"internal/linkerr": "base",
	// Capture decoding for the commands and the interop suites.
	"internal/pcapdump":  "wire",
	"internal/wirecheck": "wire",
	// A device pair over kernel UDP links for the protocols' tests: test
	// code only, so no layer lists it.
	"internal/looppair": "testhelper",
	// A tc BPF CE marker for the congestion-control tests over veth.
	"internal/ecnmark": "testhelper",
	// Every internal package is listed above: internal/ holds only what
	// the layers may use. The benchmark tools' runners open devices and
	// dial peers through cm, so they sit above the layers, in tools/.
	"tools":   "tool",
	"cmd":     "cmd",
	"interop": "interop",
	"bench":   "bench",
}

// below lists the layers each layer may import, besides packages of its own
// layer under the same top-level directory (cm → cm/mad, internal/qp/qptest → qp).
var below = map[string][]string{
	"support":    {},
	"kernel":     {},
	"wire":       {"ib", "support"},
	"testhelper": {"ib", "link", "linkimpl", "roce", "support"},
	"ib":         {},
	"qp":         {"ib", "support"},
	"link":       {"ib", "support"}, // headers: ib's codec, the only one
	"linkimpl":   {"ib", "link", "kernel"},
	// Only the device imports the engine: package roce is the one verbs API,
	// and everything above it (cm, the protocols) uses roce's names.
	// The device core never sees how a link is made: no AF_XDP, eBPF or
	// socket code, so it builds anywhere.
	"roce":         {"ib", "qp", "link"},
	"cm":           {"ib", "link", "roce"},
	"device-addon": {"ib", "link", "linkimpl", "kernel", "roce"},
	// Protocols take a device; they do not open interfaces.
	"protocol": {"ib", "link", "roce", "cm", "support"},
	"tool":     {"ib", "link", "linkimpl", "kernel", "roce", "cm", "device-addon", "protocol", "support", "wire"},
	"cmd":      {"ib", "link", "linkimpl", "kernel", "roce", "cm", "device-addon", "protocol", "support", "wire", "tool"},
	// The engine-level models (the DCQCN incast) drive the engine itself.
	"bench":   {"ib", "qp", "link", "linkimpl", "kernel", "roce", "cm", "device-addon", "protocol", "support", "wire", "tool"},
	"interop": {"ib", "link", "linkimpl", "kernel", "roce", "cm", "device-addon", "protocol", "support", "wire", "tool"},
}

// portable are the packages that must build on any GOOS, and so must not
// depend, even indirectly, on anything in forbiddenDeps.
var portable = []string{"ib", "internal/qp", "roce", "cm", "cm/mad", "link", "link/memlink"}

var forbiddenDeps = []string{
	"github.com/cilium/ebpf",
	// Following an interface (addresses, MTU, carrier, neighbours) is
	// netdev's, through roce.Host: the core asks no operating system.
	"github.com/vishvananda/netlink",
	"github.com/vishvananda/netns",
	module + "/xdp",
	module + "/bpf",
	module + "/link/xdplink",
	module + "/link/udplink",
	module + "/netdev",
}

func layerOf(rel string) (string, bool) {
	for p := rel; ; {
		if l, ok := layers[p]; ok {
			return l, true
		}
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			return "", false
		}
		p = p[:i]
	}
}

func top(rel string) string {
	if i := strings.IndexByte(rel, '/'); i >= 0 {
		return rel[:i]
	}
	return rel
}

// goTool returns the go command, or skips the test.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Skip("the go tool is not available")
	}
	return p
}

// moduleRoot is the directory of go.mod.
func moduleRoot(t *testing.T, gotool string) string {
	t.Helper()
	out, err := exec.Command(gotool, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatal("not inside the module")
	}
	return filepath.Dir(gomod)
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	gotool := goTool(t)
	cmd := exec.Command(gotool, "list", "-e", "-json=ImportPath,Imports,Deps,Error", "./...")
	cmd.Dir = moduleRoot(t, gotool)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// Imports (of non-test code) run only downward.
func TestImportsRunDownward(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		fromLayer, ok := layerOf(from)
		if !ok {
			t.Errorf("%s is in no layer: add its directory to the table in layering_test.go", from)
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			toLayer, ok := layerOf(to)
			if !ok {
				t.Errorf("%s imports %s, which is in no layer", from, to)
				continue
			}
			switch {
			case toLayer == "cmd" && (fromLayer != "cmd" || !strings.HasPrefix(to+"/", cmdRoot(from)+"/")):
				t.Errorf("%s imports %s: reusable code does not live under cmd/", from, to)
			case toLayer == fromLayer && top(from) == top(to):
			case toLayer == "base":
			case slices.Contains(below[fromLayer], toLayer):
			default:
				t.Errorf("%s (layer %s) imports %s (layer %s): imports run only downward", from, fromLayer, to, toLayer)
			}
		}
	}
}

// cmdRoot is the command directory a cmd package belongs to (cmd/rocectl).
func cmdRoot(rel string) string {
	parts := strings.SplitN(rel, "/", 3)
	if len(parts) < 2 {
		return rel
	}
	return parts[0] + "/" + parts[1]
}

// The device core and the connection manager pull in no AF_XDP, eBPF or
// link code, even indirectly: go list -deps ./cm has no cilium/ebpf.
func TestCoreDeps(t *testing.T) {
	byPath := map[string]pkg{}
	for _, p := range listPackages(t) {
		byPath[p.ImportPath] = p
	}
	for _, r := range portable {
		p, ok := byPath[module+"/"+r]
		if !ok {
			t.Errorf("package %s not found", r)
			continue
		}
		for _, d := range p.Deps {
			for _, f := range forbiddenDeps {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("%s depends on %s", r, d)
				}
			}
		}
	}
}

// The core builds on systems other than Linux: only opening an interface
// (package netdev, the links, netlink) is Linux's.
func TestCoreBuildsOffLinux(t *testing.T) {
	gotool := goTool(t)
	root := moduleRoot(t, gotool)
	args := []string{"build"}
	for _, r := range portable {
		args = append(args, "./"+r)
	}
	cmd := exec.Command(gotool, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("GOOS=darwin go build %s: %v\n%s", strings.Join(portable, " "), err, out)
	}
}

// linuxOnly are the packages, by path relative to the module, that need
// not build off Linux: AF_XDP and its steering program (xdp, bpf and the
// AF_XDP link) and the qemu interop lab. netdev, and the commands and tools
// built on it, build everywhere with the kernel UDP link. A path ending in
// "/..." covers the directory and everything under it. Every other package
// builds for darwin and windows, and its tests vet for darwin (make cross
// runs the same).
var linuxOnly = []string{
	"xdp", "bpf", "link/xdplink",
	"interop/...",
}

func isLinuxOnly(rel string) bool {
	for _, l := range linuxOnly {
		if d, ok := strings.CutSuffix(l, "/..."); ok {
			if rel == d || strings.HasPrefix(rel, d+"/") {
				return true
			}
		} else if rel == l {
			return true
		}
	}
	return false
}

// Every package but the Linux-only ones builds with GOOS=darwin and
// GOOS=windows, and vets (test files included) with GOOS=darwin: the
// kernel UDP link runs off Linux as plain UDP, so the main job could.
func TestBuildsOffLinux(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the module twice")
	}
	gotool := goTool(t)
	root := moduleRoot(t, gotool)
	var pkgs []string
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if !isLinuxOnly(rel) {
			pkgs = append(pkgs, p.ImportPath)
		}
	}
	for _, c := range []struct{ goos, goarch, verb string }{
		{"darwin", "arm64", "build"},
		{"windows", "amd64", "build"},
		{"darwin", "arm64", "vet"},
	} {
		cmd := exec.Command(gotool, append([]string{c.verb}, pkgs...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS="+c.goos, "GOARCH="+c.goarch, "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go %s (all but %s): %v\n%s", c.goos, c.verb, strings.Join(linuxOnly, ", "), err, out)
		}
	}
}

// OpenTelemetry stays in the subpackages that export to it
// (cuobj/cuobjotel): no other package of the module depends on it.
func TestOTelOnlyInAddons(t *testing.T) {
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if strings.HasSuffix(rel, "otel") {
			continue
		}
		for _, d := range p.Deps {
			if strings.HasPrefix(d, "go.opentelemetry.io/") {
				t.Errorf("%s depends on %s", rel, d)
				break
			}
		}
	}
}

// A program in a module of its own (examples/faults) sets memlink's seeded
// faults and runs: the test doubles are public, not internal to goroce.
func TestOutsideModuleSetsFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a second module")
	}
	gotool := goTool(t)
	cmd := exec.Command(gotool, "run", ".")
	cmd.Dir = filepath.Join(moduleRoot(t, gotool), "examples", "faults")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("1 MiB echoed intact")) {
		t.Fatalf("go run in examples/faults: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}

// testHarness are the layers a package's tests may import beyond what its
// code may: the links, netdev and the test helpers, so that a layer's tests
// run it over real sockets and interfaces, as gVisor's stack tests run over
// link endpoints. Nothing above the layer: a test of roce never imports
// cm, a test of cm no protocol, a protocol's test no tool or command.
var testHarness = []string{"link", "linkimpl", "kernel", "device-addon", "support", "testhelper", "wire"}

// Test imports run downward too, but for the harness above.
func TestTestImportsRunDownward(t *testing.T) {
	gotool := goTool(t)
	cmd := exec.Command(gotool, "list", "-e", "-json=ImportPath,TestImports,XTestImports", "./...")
	cmd.Dir = moduleRoot(t, gotool)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	n := 0
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p struct {
			ImportPath                string
			TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		fromLayer, ok := layerOf(from)
		if !ok {
			continue // TestImportsRunDownward reports it
		}
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			to, ok := rel(imp)
			if !ok {
				continue
			}
			n++
			toLayer, ok := layerOf(to)
			switch {
			case !ok:
				t.Errorf("%s's tests import %s, which is in no layer", from, to)
			case toLayer == "cmd" && (fromLayer != "cmd" || !strings.HasPrefix(to+"/", cmdRoot(from)+"/")):
				t.Errorf("%s's tests import %s: reusable code does not live under cmd/", from, to)
			case toLayer == fromLayer && top(from) == top(to):
			case toLayer == "base":
			case slices.Contains(below[fromLayer], toLayer):
			case slices.Contains(testHarness, toLayer):
			default:
				t.Errorf("%s's tests (layer %s) import %s (layer %s): a test imports only downward and the test harness", from, fromLayer, to, toLayer)
			}
		}
	}
	if n < 50 {
		t.Fatalf("only %d test imports inside the module: go list found too little", n)
	}
}

// The benchmarks measure the stack, not the interop lab: bench, whose code
// is all tests, imports no interop package, not even from its test files.
func TestBenchImportsNoInterop(t *testing.T) {
	gotool := goTool(t)
	cmd := exec.Command(gotool, "list", "-json=ImportPath,Imports,TestImports,XTestImports", "./bench/...")
	cmd.Dir = moduleRoot(t, gotool)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./bench/...: %v", err)
	}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if strings.HasPrefix(imp, module+"/interop") {
				t.Errorf("%s imports %s", p.ImportPath, imp)
			}
		}
	}
}

// gatewayDeps are the S3 gateway's modules (versitygw, its web framework
// and HTTP server): only the gateway package and the command that serves
// it may depend on them, even indirectly, so that the rest of goroce
// builds without them.
var gatewayDeps = []string{"github.com/versity/", "github.com/gofiber/", "github.com/valyala/"}

var gatewayUsers = []string{"cuobj/s3gw", "cmd/rocectl"}

// awsUsers may import the AWS SDK (the client's SigV4 signer).
var awsUsers = []string{"cuobj/s3rdma", "cuobj/s3gw", "cmd/rocectl"}

func TestGatewayDepsConfined(t *testing.T) {
	for _, p := range listPackages(t) {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		for _, d := range p.Deps {
			for _, g := range gatewayDeps {
				if strings.HasPrefix(d, g) && !slices.Contains(gatewayUsers, from) {
					t.Errorf("%s depends on %s: only %v may", from, d, gatewayUsers)
				}
			}
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "github.com/aws/") && !slices.Contains(awsUsers, from) {
				t.Errorf("%s imports %s: only %v may", from, imp, awsUsers)
			}
		}
	}
}

// The gateway and the command build without cgo: no package they depend
// on, outside the standard library (which has pure-Go fallbacks), has
// cgo files. (Listing is cheap; a CGO_ENABLED=0 build of all of
// versitygw is not, on a busy machine.)
func TestGatewayBuildsWithoutCgo(t *testing.T) {
	gotool := goTool(t)
	cmd := exec.Command(gotool, "list", "-e", "-deps", "-json=ImportPath,Standard,CgoFiles,Error", "./cuobj/s3gw", "./cmd/rocectl")
	cmd.Dir = moduleRoot(t, gotool)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	n := 0
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); n++ {
		var p struct {
			ImportPath string
			Standard   bool
			CgoFiles   []string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		if !p.Standard && len(p.CgoFiles) > 0 {
			t.Errorf("%s has cgo files %v", p.ImportPath, p.CgoFiles)
		}
	}
	if n < 100 {
		t.Errorf("go list found only %d packages", n)
	}
}
