package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"golang.org/x/sys/unix"
)

// inOwnNetns runs fn in a fresh network namespace when the test may create
// one (so the abstract stat sockets of parallel test runs cannot meet), and
// in the test's own namespace otherwise.
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

func statJSON(t *testing.T, args ...string) (int, []statEntry) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"stat", "-j"}, args...), &out, &errOut)
	var es []statEntry
	if err := json.Unmarshal(out.Bytes(), &es); err != nil {
		t.Fatalf("stat -j %v: exit %d, %v: %q %q", args, code, err, out.String(), errOut.String())
	}
	return code, es
}

func checkCounterNames(t *testing.T, e statEntry) {
	t.Helper()
	for _, n := range roce.CounterNames {
		if _, ok := e.Counters[n]; !ok {
			t.Errorf("counter %s missing from %v", n, e.Counters)
		}
	}
}

// TestStatPublished runs a device over the in-memory link, publishes it and
// reads it back with stat, as another process would.
func TestStatPublished(t *testing.T) {
	inOwnNetns(t, func() {
		a, b := memlink.Pair(faultnet.Config{}, faultnet.Config{})
		dev, err := roce.OpenLink(a, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.1.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		defer b.Close()
		name := dev.Info().Name
		var errOut bytes.Buffer
		stop := publishStats(dev, "test", &errOut)
		if errOut.Len() != 0 {
			t.Fatalf("publish: %s", errOut.String())
		}
		// A second device on the same interface is refused, not fatal.
		publishStats(dev, "again", &errOut)()
		if !strings.Contains(errOut.String(), "already published") {
			t.Errorf("second publish: %q", errOut.String())
		}

		// Junk from the peer: received and counted as a bad frame.
		if _, err := b.WriteBatch([][]byte{make([]byte, 60), make([]byte, 60)}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Second)
		for dev.Counters().RcvdPkts < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("frames not received: %+v", dev.Counters())
			}
			time.Sleep(5 * time.Millisecond)
		}
		code, es := statJSON(t, "-d", name)
		if code != 0 || len(es) != 1 {
			t.Fatalf("stat: exit %d, %+v", code, es)
		}
		e := es[0]
		if !e.Running || e.PID != os.Getpid() || e.Command != "test" || e.Link != "mem" || e.Interface != name {
			t.Errorf("stat entry: %+v", e)
		}
		checkCounterNames(t, e)
		want := dev.Counters().Map()
		for n, v := range want {
			if e.Counters[n] != v {
				t.Errorf("%s = %d, device says %d", n, e.Counters[n], v)
			}
		}
		if e.Counters["rcvd_pkts"] != 2 {
			t.Errorf("rcvd_pkts = %d, want 2", e.Counters["rcvd_pkts"])
		}

		// Listed without -d; the human form names every counter.
		if _, es := statJSON(t); len(es) != 1 || es[0].Interface != name {
			t.Errorf("stat without -d: %+v", es)
		}
		var out bytes.Buffer
		if code := run([]string{"stat", "-d", name}, &out, &errOut); code != 0 {
			t.Errorf("stat: exit %d", code)
		}
		for _, n := range roce.CounterNames {
			if !strings.Contains(out.String(), n) {
				t.Errorf("human output lacks %s:\n%s", n, out.String())
			}
		}
		if !strings.Contains(out.String(), "link "+name+"/1 pid") {
			t.Errorf("human output: %q", out.String())
		}

		stop()
		code, es = statJSON(t, "-d", name)
		if code != 1 || len(es) != 1 || es[0].Running || es[0].Counters != nil {
			t.Errorf("stat after the device stopped publishing: exit %d, %+v", code, es)
		}
		if _, es := statJSON(t); len(es) != 0 {
			t.Errorf("stat without devices: %+v", es)
		}
	})
}

// TestStatXDP runs a device over AF_XDP on a veth and checks that stat
// shows its counters and its steering program's, read from the kernel.
func TestStatXDP(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	a := p.VethA
	var dev *roce.Device
	if err := a.NS.Do(func() (err error) {
		dev, err = netdev.Open(context.Background(), a.Name, netdev.Options{Link: netdev.LinkXDP})
		return err
	}); err != nil {
		t.Skipf("AF_XDP device unavailable here: %v", err)
	}
	defer dev.Close()
	var stop func()
	var errOut bytes.Buffer
	_ = a.NS.Do(func() error { stop = publishStats(dev, "test", &errOut); return nil })
	defer stop()
	if errOut.Len() != 0 {
		t.Fatal(errOut.String())
	}
	// Not RoCEv2, but to port 4791: steered to the socket, then dropped by
	// the device as a bad frame.
	if err := p.B.Do(func() error {
		c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: a.Addr.Addr().AsSlice(), Port: 4791})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, 40))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		var code int
		var es []statEntry
		_ = a.NS.Do(func() error { code, es = statJSON(t, "-d", a.Name); return nil })
		if code != 0 || len(es) != 1 || !es[0].Running {
			t.Fatalf("stat: exit %d, %+v", code, es)
		}
		e := es[0]
		checkCounterNames(t, e)
		if e.Steering != nil && e.Steering.Redirected >= 1 && e.Counters["rcvd_pkts"] >= 1 {
			if e.Steering.ProgramID == 0 || e.Link != "afxdp" {
				t.Errorf("stat entry: %+v", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("frame not steered and counted: %+v %+v", e.Steering, e.Counters)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var out, eo bytes.Buffer
	_ = a.NS.Do(func() error { run([]string{"stat"}, &out, &eo); return nil })
	if !strings.Contains(out.String(), "xdp id ") || !strings.Contains(out.String(), "redirected 1") {
		t.Errorf("stat: %q %q", out.String(), eo.String())
	}
}
