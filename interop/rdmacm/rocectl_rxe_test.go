package rdmacm

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/rxelab"
)

// buildRocectl builds the rocectl command into a temporary directory.
func buildRocectl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rocectl")
	out, err := exec.Command("go", "build", "-o", bin, filepath.Join(repoRoot(t), "cmd", "rocectl")).CombinedOutput()
	if err != nil {
		t.Fatalf("building rocectl: %v\n%s", err, out)
	}
	return bin
}

// TestRxeRocectl runs "rocectl rping" (the command, with its interface
// lookup from -a) in the lab's peer netns against rping in the guest, in
// both roles.
func TestRxeRocectl(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	labDev.release() // rocectl opens rxeh0 itself
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip(8) not installed")
	}
	bin := buildRocectl(t)
	const count = 4
	run := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lab.PeerNS, bin, "rping"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Run("client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		job := g.Start(ctx, "rping", "-s", "-a", g.Addr.String(), "-C", strconv.Itoa(count), "-v")
		var out string
		var err error
		for i := 0; i < 100; i++ {
			// rping may not listen yet (REJ): rocectl then fails at once.
			if out, err = run(ctx, "-c", "-a", g.Addr.String(), "-C", strconv.Itoa(count), "-v", "-V"); err == nil {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("rocectl rping -c: %v\n%s", err, out)
		}
		if want := expectedPings("", count); !strings.HasPrefix(out, want) {
			t.Errorf("rocectl rping -c printed\n%s\nwant\n%s", out, want)
		}
		if stdout, stderr, code, err := job.Wait(); err != nil || code != 0 {
			t.Fatalf("rping -s: exit %d (%v)\n%s%s", code, err, stdout, stderr)
		}
	})
	t.Run("server", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		type result struct {
			out string
			err error
		}
		srv := make(chan result, 1)
		go func() {
			out, err := run(ctx, "-s", "-a", lab.PeerAddr.String(), "-C", strconv.Itoa(count), "-v")
			srv <- result{out, err}
		}()
		var stdout, stderr []byte
		var code int
		var err error
		for i := 0; i < 50; i++ {
			// Until rocectl listens, the guest's rping fails (REJ or no answer).
			if stdout, stderr, code, err = g.Exec(ctx, "rping", "-c", "-a", lab.PeerAddr.String(), "-C", strconv.Itoa(count), "-v", "-V"); err == nil && code == 0 {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil || code != 0 {
			t.Fatalf("rping -c: exit %d (%v)\n%s%s", code, err, stdout, stderr)
		}
		if want := expectedPings("", count); string(stdout) != want {
			t.Errorf("rping -c printed\n%s\nwant\n%s", stdout, want)
		}
		r := <-srv
		if r.err != nil {
			t.Fatalf("rocectl rping -s: %v\n%s", r.err, r.out)
		}
		if want := expectedPings("server ", count); !strings.HasPrefix(r.out, want) {
			t.Errorf("rocectl rping -s printed\n%s\nwant\n%s", r.out, want)
		}
	})
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(strings.TrimSpace(string(out))) == 0 {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}
