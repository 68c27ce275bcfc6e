package devstat

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
	"golang.org/x/sys/unix"
)

const unixSample = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 21180 @goroce/stat/eth0
0000000000000000: 00000003 00000000 00000000 0001 03 21181 @goroce/stat/eth0
0000000000000000: 00000002 00000000 00010000 0001 01 21182 @goroce/stat/veth1
0000000000000000: 00000002 00000000 00000000 0001 01 21183 @goroce/stat/notlistening
0000000000000000: 00000002 00000000 00010000 0001 01 21184 @goroce/stat/bad/name
0000000000000000: 00000002 00000000 00010000 0001 01 21185 /run/systemd/notify
0000000000000000: 00000002 00000000 00010000 0001 01 21186
garbage
`

func TestParseUnix(t *testing.T) {
	got, err := parseUnix(strings.NewReader(unixSample))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "eth0,veth1" {
		t.Errorf("parseUnix = %v", got)
	}
}

func TestCheckName(t *testing.T) {
	for _, n := range []string{"", "a/b", "has space", "0123456789abcdef", "x\x00",
		"lo@", "@127.0.0.5", "lo@127.0.0.5/8", "lo@127.0.0.05", "lo@::ffff:127.0.0.5x", "lo@1@2", "lo@a/../b"} {
		if checkName(n) == nil {
			t.Errorf("checkName(%q) accepted", n)
		}
	}
	for _, n := range []string{"lo", "eth0@192.168.100.200", "lo@127.0.0.5", "veth1@fd00::2"} {
		if err := checkName(n); err != nil {
			t.Errorf("checkName(%q): %v", n, err)
		}
	}
	if _, err := Query(context.Background(), "../x"); err == nil {
		t.Error("Query accepted a path")
	}
}

// inOwnNetns runs fn in a fresh network namespace when possible, so
// abstract socket names cannot collide with another test process.
func inOwnNetns(t *testing.T, fn func()) {
	t.Helper()
	if ok, _ := netnstest.HasCap(netnstest.Cap(unix.CAP_SYS_ADMIN)); !ok {
		fn()
		return
	}
	ns := netnstest.New(t)
	if err := ns.Do(func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestPublishQuery(t *testing.T) {
	inOwnNetns(t, func() {
		a, b := memlink.Pair(faultnet.Config{}, faultnet.Config{})
		defer b.Close()
		dev, err := roce.OpenLink(a, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.1.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		name := dev.Info().Name
		if _, err := Query(context.Background(), name); !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Query before Publish: %v", err)
		}
		pub, err := Publish(dev, "test")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Publish(dev, "test"); !errors.Is(err, ErrPublished) {
			t.Errorf("second Publish: %v", err)
		}
		if l, err := List(); err != nil || len(l) != 1 || l[0] != name {
			t.Errorf("List = %v, %v", l, err)
		}
		start := time.Now()
		s, err := Query(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if s.Interface != name || s.PID != os.Getpid() || s.Command != "test" || s.Link != "mem" ||
			s.Time.Before(start) || s.Started.After(s.Time) || s.Steering != nil {
			t.Errorf("snapshot: %+v", s)
		}
		if len(s.Counters) != len(roce.CounterNames) {
			t.Errorf("%d counters, want %d", len(s.Counters), len(roce.CounterNames))
		}
		// Many readers connected at once are all answered. (Connections are
		// made on this thread: other goroutines are not in its namespace.)
		var conns []net.Conn
		for range 20 {
			c, err := net.Dial("unix", SocketPrefix+name)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			var s Snapshot
			if err := json.NewDecoder(c).Decode(&s); err != nil || s.Interface != name {
				t.Errorf("reader: %+v, %v", s, err)
			}
			c.Close()
		}
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
		pub.Close()
		if _, err := Query(context.Background(), name); !errors.Is(err, ErrNoDevice) {
			t.Errorf("Query after Close: %v", err)
		}
		if l, _ := List(); len(l) != 0 {
			t.Errorf("List after Close = %v", l)
		}
		// The name is free again.
		pub, err = Publish(dev, "again")
		if err != nil {
			t.Fatal(err)
		}
		pub.Close()
	})
}

// TestProgramStats checks ProgramStats, which reads the counter map by
// program id, against bpf.Program.Stats on a program that saw traffic.
func TestProgramStats(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	prog, err := bpf.Load(bpf.Options{})
	if err != nil {
		t.Skipf("cannot load the steering program here: %v", err)
	}
	defer prog.Close()
	var att *bpf.Attachment
	if err := p.A.Do(func() (err error) {
		att, err = prog.Attach(p.VethA.Index, bpf.AttachGeneric)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	// Two datagrams to 4791 (no socket) and one to another port (passed).
	if err := p.B.Do(func() error {
		for _, port := range []int{4791, 4791, 9} {
			c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: p.VethA.Addr.Addr().AsSlice(), Port: port})
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("x"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	id, err := prog.ID()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		want, err := prog.Stats()
		if err != nil {
			t.Fatal(err)
		}
		got, err := ProgramStats(id)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("ProgramStats = %+v, Program.Stats = %+v", got, want)
		}
		if got.NoSocket >= 2 && got.Passed >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("traffic not counted: %+v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := ProgramStats(0xFFFFFFF); err == nil {
		t.Error("ProgramStats of a missing program succeeded")
	}
}

func FuzzParseUnix(f *testing.F) {
	f.Add(unixSample)
	f.Add("header\n0: 1 2 zz 4 5 6 @goroce/stat/x\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		names, err := parseUnix(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, n := range names {
			if checkName(n) != nil {
				t.Fatalf("invalid name %q listed", n)
			}
		}
	})
}
