package naaice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

func TestMain(m *testing.M) {
	// MTU 1500: path MTU 1024 on both sides, frames fit AF_XDP chunks.
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 1500,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	if labDev.dev != nil {
		labDev.dev.Close()
	}
	os.Exit(code)
}

// Guest paths of the binaries the setup copies into the guest's share.
const (
	guestDir    = "/mnt/lab/files/"
	guestServer = guestDir + "naaice_server"
	guestClient = guestDir + "naaice_client"
	guestAP2    = guestDir + "naaice_client_ap2"
	guestVerify = guestDir + "naaice_verify"
)

// syncOnce lets TestRocectl reset the device's once after closing it.
type syncOnce = sync.Once

var labDev struct {
	once syncOnce
	dev  *roce.Device
	err  error
}

var cBuild struct {
	once sync.Once
	dir  string // holds bin/ and the built verifying client
	err  error
	skip string
}

// naaiceDir finds the NAAICE C library's snapshot and build script: the
// GOROCE_NAAICE_DIR environment variable, or shared/naaice in a folder
// above the repository.
func naaiceDir(t *testing.T) (string, string) {
	if d := os.Getenv("GOROCE_NAAICE_DIR"); d != "" {
		return d, ""
	}
	for d := filepath.Dir(repoRoot(t)); ; d = filepath.Dir(d) {
		p := filepath.Join(d, "shared", "naaice")
		if _, err := os.Stat(filepath.Join(p, "build.sh")); err == nil {
			return p, ""
		}
		if filepath.Dir(d) == d {
			return "", "NAAICE C library snapshot not found (set GOROCE_NAAICE_DIR to the folder with build.sh and src/)"
		}
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(strings.TrimSpace(string(out))) == 0 {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// stamp hashes the build inputs, so that a cached build is reused only
// for the same sources.
func stamp(paths ...string) string {
	h := sha256.New()
	for _, p := range paths {
		matches, _ := filepath.Glob(p)
		for _, m := range matches {
			f, err := os.Open(m)
			if err != nil {
				continue
			}
			io.Copy(h, f)
			f.Close()
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// buildC builds the C library's examples with its build script (cached in
// the lab cache) and the verifying client of cclient/ against it.
func buildC(t *testing.T) string {
	cBuild.once.Do(func() {
		src, skip := naaiceDir(t)
		if skip != "" {
			cBuild.skip = skip
			return
		}
		cache := os.Getenv("RXE_LAB_CACHE")
		if cache == "" {
			cache = "/var/cache/goroce/rxe-lab"
		}
		out := filepath.Join(cache, "naaice")
		verify, _ := filepath.Abs("cclient/naaice_verify.c")
		want := stamp(filepath.Join(src, "build.sh"), filepath.Join(src, "src", "*"), verify)
		if got, _ := os.ReadFile(filepath.Join(out, "stamp")); string(got) == want {
			cBuild.dir = out
			return
		}
		if err := os.MkdirAll(out, 0o755); err != nil {
			cBuild.err = err
			return
		}
		t0 := time.Now()
		cmd := exec.Command("sh", filepath.Join(src, "build.sh"), out)
		if b, err := cmd.CombinedOutput(); err != nil {
			cBuild.err = fmt.Errorf("build.sh: %v\n%s", err, b)
			return
		}
		lib := filepath.Join(out, "src", "naa-communication-library-f7b72fcae373", "lib")
		cmd = exec.Command("cc", "-O2", "-Wall", "-I"+lib, "-I"+filepath.Join(out, "cmake", "lib"),
			"-I"+filepath.Join(out, "src", "microlog-v7.0.3", "include"), "-o", filepath.Join(out, "bin", "naaice_verify"),
			verify, filepath.Join(out, "cmake", "lib", "libnaaice_low_level.a"), "-libverbs", "-lrdmacm")
		if b, err := cmd.CombinedOutput(); err != nil {
			cBuild.err = fmt.Errorf("building naaice_verify: %v\n%s", err, b)
			return
		}
		t.Logf("built the NAAICE C library and naaice_verify in %v", time.Since(t0).Round(time.Second))
		cBuild.err = os.WriteFile(filepath.Join(out, "stamp"), []byte(want), 0o644)
		cBuild.dir = out
	})
	if cBuild.skip != "" {
		t.Skip(cBuild.skip)
	}
	if cBuild.err != nil {
		t.Fatal(cBuild.err)
	}
	return cBuild.dir
}

// setup boots the lab, puts the C binaries into the guest and opens goroce
// on the lab's host interface.
func setup(t *testing.T) (*rxelab.Lab, *rxelab.Guest, *roce.Device) {
	t.Helper()
	dir := buildC(t)
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	labDev.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		share, err := g.Share(ctx)
		if err != nil {
			labDev.err = err
			return
		}
		for _, b := range []string{"naaice_server", "naaice_client", "naaice_client_ap2", "naaice_verify"} {
			data, err := os.ReadFile(filepath.Join(dir, "bin", b))
			if err == nil {
				err = os.WriteFile(filepath.Join(share, b), data, 0o755)
			}
			if err != nil {
				labDev.err = err
				return
			}
		}
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		labDev.err = lab.InPeerNS(func() error {
			var err error
			labDev.dev, err = netdev.Open(ctx, lab.PeerIf, netdev.Options{Link: netdev.LinkXDP, Device: roce.Options{Logger: logger}})
			return err
		})
		if labDev.err == nil {
			t.Logf("goroce on %s: %+v", lab.PeerIf, labDev.dev.Info())
		}
	})
	if labDev.err != nil {
		t.Fatalf("lab setup: %v", labDev.err)
	}
	return lab, g, labDev.dev
}
