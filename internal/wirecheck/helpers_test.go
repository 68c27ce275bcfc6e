package wirecheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/pcapdump"
)

// testSeed fixes the generated frames, so a failure names a reproducible case.
const testSeed = 0x526f4345

// repoRoot is the directory holding go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// captures returns the real rxe captures next to the repository (CI puts
// shared/ beside it), or skips the test when they are absent.
func captures(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "..", "shared", "rxe-lab", "captures")
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".pcap") || strings.HasSuffix(path, ".pcapng")) {
			files = append(files, path)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(files) == 0) {
		t.Skipf("no rxe-lab captures at %s (the shared/ directory is placed next to the repository in CI)", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// generatedPCAP writes the generated frames to a pcap in a temp dir.
func generatedPCAP(t *testing.T) (string, []Case) {
	t.Helper()
	cases, err := Generate(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "generated.pcap")
	var buf bytes.Buffer
	if err := WritePCAP(&buf, Frames(cases)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, cases
}

// rocectlJSON runs "rocectl pcap --json file" in-process and decodes its
// lines. A non-zero exit fails the test unless wantFail.
func rocectlJSON(t *testing.T, file string) []pcapdump.Record {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := pcapdump.Run([]string{"--json", file}, &stdout, &stderr); code != 0 {
		t.Fatalf("rocectl pcap --json %s: exit %d: %s", file, code, stderr.String())
	}
	var recs []pcapdump.Record
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r pcapdump.Record
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("decoding rocectl output: %v", err)
		}
		recs = append(recs, r)
	}
	return recs
}

func toolCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func relName(t *testing.T, path string) string {
	if r, err := filepath.Rel(filepath.Join(repoRoot(t), ".."), path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return filepath.Base(path)
}
