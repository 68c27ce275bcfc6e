package rping

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
)

func devPair(t testing.TB) (*roce.Device, *roce.Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// TestGoToGo runs both roles over an in-memory link and checks the
// output against what the real tools print.
func TestGoToGo(t *testing.T) {
	da, db := devPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sout, cout bytes.Buffer
	srvErr := make(chan error, 1)
	go func() {
		srvErr <- Server(ctx, db, netip.AddrPortFrom(addrB, DefaultPort), Config{Count: 3, Verbose: true, Out: &sout})
	}()
	var err error
	for i := 0; i < 50; i++ { // until the server listens
		// Before B's CM exists its QP1 drops the REQ: retry soon.
		actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
		cout.Reset()
		err = Client(actx, da, netip.AddrPortFrom(addrB, DefaultPort), Config{Count: 3, Verbose: true, Validate: true, Out: &cout})
		acancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := <-srvErr; err != nil {
		t.Fatal(err)
	}
	want := "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\n" +
		"ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs\n" +
		"ping data: rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst\n"
	if cout.String() != want {
		t.Errorf("client printed\n%s\nwant\n%s", cout.String(), want)
	}
	if !strings.HasPrefix(sout.String(), "server "+strings.Split(want, "\n")[0]) || !strings.Contains(sout.String(), "server DISCONNECT EVENT...") {
		t.Errorf("server printed\n%s", sout.String())
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []Config{{Size: MinSize - 1}, {Size: MaxSize + 1}, {Count: -1}} {
		if err := c.check(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if MinSize != 26 {
		t.Errorf("MinSize %d, rping's RPING_MIN_BUFSIZE is 26", MinSize)
	}
}

// A client whose server does not answer fails when its connect step
// expires, not after cm.Dial's own retries, and says so.
func TestConnectTimeout(t *testing.T) {
	da, _ := devPair(t)                             // b runs no connection manager: nothing answers
	raddr := netip.AddrPortFrom(addrB, DefaultPort) // a device, nobody listening
	start := time.Now()
	err := Client(context.Background(), da, raddr, Config{Count: 1,
		ConnectTimeout: 1500 * time.Millisecond, ConnectAttempt: 500 * time.Millisecond})
	took := time.Since(start)
	if !errors.Is(err, ErrConnectTimeout) || !strings.Contains(err.Error(), "connect step expired") {
		t.Errorf("%v: error %v, want ErrConnectTimeout", raddr, err)
	}
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("%v: error %v is not a net.Error timeout", raddr, err)
	}
	if took > 4*time.Second {
		t.Errorf("%v: failed after %v, the bound is 1.5 s", raddr, took)
	}
}
