package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/cm/rping"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

func TestMain(m *testing.M) {
	// MTU 1500: rdma_cm's path MTU is then 1024 on both sides, and frames
	// fit AF_XDP's 4096-byte chunks.
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 1500, IPv6: true,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	labDev.close()
	os.Exit(code)
}

// sharedDev is the goroce device on the lab's rxeh0, opened once.
type sharedDev struct {
	once sync.Once
	dev  *roce.Device
	err  error
}

func (d *sharedDev) close() {
	if d.dev != nil {
		d.dev.Close()
	}
}

// release closes the shared device so that another program can own rxeh0;
// the next rxeSetup opens it again.
func (d *sharedDev) release() {
	d.close()
	*d = sharedDev{}
}

var labDev sharedDev

func rxeSetup(t *testing.T) (*rxelab.Lab, *rxelab.Guest, *roce.Device) {
	t.Helper()
	lab := rxelab.Get(t)
	labDev.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		opts := roce.Options{Logger: logger}
		if p := os.Getenv("GOROCE_CM_CAPTURE"); p != "" { // debugging: pcap of everything the device saw
			f, err := os.Create(p)
			if err == nil {
				opts.Capture = f
			}
		}
		labDev.err = lab.InPeerNS(func() error {
			var err error
			labDev.dev, err = netdev.Open(ctx, lab.PeerIf, netdev.Options{Device: opts})
			return err
		})
		if labDev.err == nil {
			t.Logf("goroce on %s: %+v", lab.PeerIf, labDev.dev.Info())
		}
	})
	if labDev.err != nil {
		t.Fatalf("opening goroce on %s: %v", lab.PeerIf, labDev.err)
	}
	return lab, lab.Guests[0], labDev.dev
}

// expectedPings is what rping -v prints for count pings of the default size.
func expectedPings(prefix string, count int) string {
	var b strings.Builder
	for i := 0; i < count; i++ {
		buf := make([]byte, rping.DefaultSize)
		n := copy(buf, "rdma-ping-"+strconv.Itoa(i)+": ")
		for j, c := n, byte(65+i); j < len(buf); j++ {
			buf[j] = c
			if c++; c > 122 {
				c = 65
			}
		}
		fmt.Fprintf(&b, "%sping data: %s\n", prefix, buf[:len(buf)-1])
	}
	return b.String()
}

// TestRxeServer: the real rping server in the guest, our client, over
// IPv4 and IPv6.
func TestRxeServer(t *testing.T) {
	_, g, _ := rxeSetup(t)
	t.Run("IPv4", func(t *testing.T) { rxeServer(t, g.Addr) })
	t.Run("IPv6", func(t *testing.T) {
		if !g.Addr6.IsValid() {
			t.Skip("lab without IPv6")
		}
		rxeServer(t, g.Addr6)
	})
}

func rxeServer(t *testing.T, addr netip.Addr) {
	_, g, dev := rxeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const count = 5
	job := g.Start(ctx, "rping", "-s", "-a", addr.String(), "-C", strconv.Itoa(count), "-v")
	defer job.Wait()
	var out bytes.Buffer
	var err error
	for {
		out.Reset()
		err = rping.Client(ctx, dev, netip.AddrPortFrom(addr, rping.DefaultPort), rping.Config{Count: count, Verbose: true, Validate: true, Out: &out})
		// Until rping listens, rxe's CM answers REJ INVALID_SERVICE_ID.
		if !errors.Is(err, mad.RejInvalidServiceID) {
			break
		}
		select {
		case <-job.Done():
			stdout, stderr, code, _ := job.Wait()
			t.Fatalf("rping server exited %d before we connected\n%s%s", code, stdout, stderr)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err != nil {
		dev.FlushCapture()
		t.Fatalf("client: %v\ncounters %+v", err, dev.Counters())
	}
	if want := expectedPings("", count); out.String() != want {
		t.Errorf("our client printed\n%s\nwant\n%s", out.String(), want)
	}
	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 {
		t.Fatalf("rping -s: exit %d (%v)\n%s%s", code, err, stdout, stderr)
	}
	if want := expectedPings("server ", count); !strings.HasPrefix(string(stdout), want) {
		t.Errorf("rping -s printed\n%s\nwant\n%s", stdout, want)
	}
	t.Logf("rping -s:\n%s%s", stdout, stderr)
}

// TestRxeClient: our server, the real rping client in the guest with -V.
func TestRxeClient(t *testing.T) {
	lab, g, dev := rxeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const count = 5
	var out bytes.Buffer
	srv := make(chan error, 1)
	go func() {
		srv <- rping.Server(ctx, dev, netipPort(lab.PeerAddr.String()), rping.Config{Count: count, Verbose: true, Out: &out})
	}()
	var stdout, stderr []byte
	var code int
	var err error
	for i := 0; i < 20; i++ {
		// Until our server listens, the guest's rping is rejected (REJ 8)
		// or unanswered; try again.
		stdout, stderr, code, err = g.Exec(ctx, "rping", "-c", "-a", lab.PeerAddr.String(), "-C", strconv.Itoa(count), "-v", "-V")
		if err != nil || code == 0 || !strings.Contains(string(stdout)+string(stderr), "REJECTED, error 8") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || code != 0 {
		t.Fatalf("rping -c: exit %d (%v)\n%s%s", code, err, stdout, stderr)
	}
	if want := expectedPings("", count); string(stdout) != want {
		t.Errorf("rping -c printed\n%s\nwant\n%s", stdout, want)
	}
	if err := <-srv; err != nil {
		t.Fatalf("server: %v", err)
	}
	if want := expectedPings("server ", count); !strings.HasPrefix(out.String(), want) {
		t.Errorf("our server printed\n%s\nwant\n%s", out.String(), want)
	}
	t.Logf("rping -c:\n%s%s", stdout, stderr)
}

// TestRxeRejects: the kernel's rdma_cm reports our REJs as rping shows
// them: no listener on the port (INVALID_SERVICE_ID, 8) and a listener
// bound to another address (CONSUMER_DEFINED, 28).
func TestRxeRejects(t *testing.T) {
	lab, g, dev := rxeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A listener on 7175 bound to an address the guest will not name (the
	// IPv6 one): the agent runs, so QP1 answers.
	other := lab.PeerAddr6
	if !other.IsValid() {
		t.Skip("lab without IPv6")
	}
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(other, 7175), cm.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		port string
		want string
	}{{"7176", "RDMA_CM_EVENT_REJECTED, error 8"}, {"7175", "RDMA_CM_EVENT_REJECTED, error 28"}} {
		stdout, stderr, code, err := g.Exec(ctx, "rping", "-c", "-a", lab.PeerAddr.String(), "-p", c.port, "-C", "1")
		if err != nil || code == 0 || !strings.Contains(string(stdout)+string(stderr), c.want) {
			t.Errorf("rping -c -p %s: exit %d (%v), want %q\n%s%s", c.port, code, err, c.want, stdout, stderr)
		}
	}
}

func netipPort(a string) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(a), rping.DefaultPort)
}
