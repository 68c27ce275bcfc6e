package layering

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Exported closed and timeout sentinels come from internal/errclosed and
// internal/errtimeout, so that every closed error matches net.ErrClosed and
// every timeout is a net.Error whose Timeout() is true: a plain
// errors.New for one of them is an error that generic callers misread.
var (
	plainClosed  = regexp.MustCompile(`\bErr\w*\s*(error\s*)?=\s*errors\.New\("[^"]*\bclosed\b`)
	plainTimeout = regexp.MustCompile(`\bErr\w*(Timeout|TimedOut|Deadline)\w*\s*(error\s*)?=\s*errors\.New\(`)
)

func TestSentinelsAreNetErrors(t *testing.T) {
	root := moduleRoot(t, goTool(t))
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n != "." && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		rel, _ := filepath.Rel(root, path)
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case plainClosed.MatchString(l):
				t.Errorf("%s: %s: a closed sentinel is errclosed.New, which matches net.ErrClosed", rel, strings.TrimSpace(l))
			case plainTimeout.MatchString(l):
				t.Errorf("%s: %s: a timeout sentinel is errtimeout.New, a net.Error timeout", rel, strings.TrimSpace(l))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d files", checked)
	}
}

// The patterns catch what they are for.
func TestSentinelPatterns(t *testing.T) {
	for _, l := range []string{
		`	ErrClosed = errors.New("x: closed")`,
		`var ErrConnClosed error = errors.New("x: connection closed by peer")`,
	} {
		if !plainClosed.MatchString(l) {
			t.Errorf("closed pattern misses %q", l)
		}
	}
	for _, l := range []string{
		`	ErrConnectTimeout = errors.New("rping: the connect step expired")`,
		`var ErrTimeout error = errors.New("x")`,
	} {
		if !plainTimeout.MatchString(l) {
			t.Errorf("timeout pattern misses %q", l)
		}
	}
	for _, l := range []string{
		`	ErrClosed = errclosed.New("x: closed")`,
		`	ErrTimeout = errtimeout.New("x")`,
		`var errEvicted = errors.New("naaice: idle connection closed for a new one")`,
	} {
		if plainClosed.MatchString(l) || plainTimeout.MatchString(l) {
			t.Errorf("a pattern matches %q", l)
		}
	}
}
