package s3gw

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzInside: whatever a request's path, inside never panics, and a name
// it lets through resolves, link by link, to a place inside the root.
func FuzzInside(f *testing.F) {
	for _, s := range []string{"/", "/b/k", "/b/../../etc/passwd", "/b/out/secret", "/b/in/k", "/out", "//b//./k", "/b/dangling/x", "/b/k/../../.."} {
		f.Add(s)
	}
	base := f.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	os.MkdirAll(filepath.Join(root, "b", "d"), 0o755)
	os.MkdirAll(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "secret"), nil, 0o644)
	os.Symlink(outside, filepath.Join(root, "b", "out"))
	os.Symlink(outside, filepath.Join(root, "out"))
	os.Symlink(filepath.Join(root, "b", "d"), filepath.Join(root, "b", "in"))
	os.Symlink(filepath.Join(base, "nothing"), filepath.Join(root, "b", "dangling"))
	f.Fuzz(func(t *testing.T, name string) {
		if !inside(root, name) {
			return
		}
		p := root
		for _, part := range strings.Split(name, "/") {
			if part == "" || part == "." {
				continue
			}
			p = filepath.Join(p, part)
			r, err := filepath.EvalSymlinks(p)
			if err != nil {
				return // the rest does not exist
			}
			if r != root && !strings.HasPrefix(r, root+string(filepath.Separator)) {
				t.Fatalf("inside(%q) but %s is %s", name, p, r)
			}
		}
	})
}
