package cuobjotel

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

func devices(t *testing.T) (*roce.Device, *roce.Device, netip.Addr) {
	srvIP, cliIP := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}, net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{srvIP}, Neighbours: map[netip.Addr]net.HardwareAddr{cliIP: macB}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{cliIP}, Neighbours: map[netip.Addr]net.HardwareAddr{srvIP: macA}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db, srvIP
}

// TestMetrics: a GET and a PUT, and a refused request, read back through
// the SDK's manual reader.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h, err := NewHandler(mp, nil)
	if err != nil {
		t.Fatal(err)
	}
	tel := &cuobj.Telemetry{Logger: slog.New(h), Flags: cuobj.LogPathError | cuobj.LogPathInfo}

	sdev, cdev, srvIP := devices(t)
	srv, err := cuobj.NewServer(sdev, netip.AddrPortFrom(srvIP, 18515), cuobj.ServerOptions{Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const size = 64 << 10
	sbuf, _ := srv.AllocHostBuffer(size)
	sreg, err := srv.RegisterBuffer(sbuf)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := srv.AllocateChannel()
	req := func(info *cuobj.RDMAInfo, n int) *cuobj.Request {
		return &cuobj.Request{Local: sreg, RemoteAddr: info.Token.Addr, Size: uint64(n), Token: info.Desc, Channel: ch}
	}
	ops := cuobj.Ops{
		Get: func(h *cuobj.Handle, chunk []byte, off int64, info *cuobj.RDMAInfo) (int, error) {
			n, err := srv.HandleGetObject(h.Context(), req(info, len(chunk)))
			return int(n), err
		},
		Put: func(h *cuobj.Handle, chunk []byte, off int64, info *cuobj.RDMAInfo) (int, error) {
			n, err := srv.HandlePutObject(h.Context(), req(info, len(chunk)))
			return int(n), err
		},
	}
	cfg := cuobj.DefaultConfig()
	cli, err := cuobj.NewClient(cdev, ops, cuobj.ClientOptions{Config: &cfg, Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := RegisterServer(mp, srv, attribute.String("endpoint", "s1")); err != nil {
		t.Fatal(err)
	}
	if _, err := RegisterClient(mp, cli); err != nil {
		t.Fatal(err)
	}

	for i := range sbuf {
		sbuf[i] = byte(i * 7)
	}
	buf := make([]byte, size)
	if err := cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if n, err := cli.Get(ctx, "u", buf, 0, 0); err != nil || n != size || !bytes.Equal(buf, sbuf) {
		t.Fatalf("Get: %d, %v", n, err)
	}
	if n, err := cli.Put(ctx, "u", buf, 0, 0); err != nil || n != size {
		t.Fatalf("Put: %d, %v", n, err)
	}
	if _, err := srv.HandleGetObject(ctx, &cuobj.Request{Local: sreg, RemoteAddr: 1, Size: 1, Token: "garbage", Channel: ch}); err == nil {
		t.Fatal("a garbage token was served")
	}

	collect := func() map[string]int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			if sm.Scope.Name != MeterName {
				continue
			}
			for _, m := range sm.Metrics {
				sum, ok := m.Data.(metricdata.Sum[int64])
				if !ok {
					t.Errorf("%s: %T, want an int64 sum", m.Name, m.Data)
					continue
				}
				if !sum.IsMonotonic {
					t.Errorf("%s is not monotonic", m.Name)
				}
				for _, dp := range sum.DataPoints {
					var keys []string
					for _, kv := range dp.Attributes.ToSlice() {
						keys = append(keys, string(kv.Key)+"="+kv.Value.Emit())
					}
					got[m.Name+"{"+strings.Join(keys, ",")+"}"] += dp.Value
				}
			}
		}
		return got
	}
	// The client notes the connection when its accept completes, which
	// may be after the server's first request has.
	const connected = "cuobj.events{component=cuobj-client,level=INFO,msg=server connected}"
	got := collect()
	for deadline := time.Now().Add(10 * time.Second); got[connected] == 0 && time.Now().Before(deadline); got = collect() {
		time.Sleep(10 * time.Millisecond)
	}
	for k, v := range got {
		t.Logf("%s = %d", k, v)
	}
	for k, want := range map[string]int64{
		"cuobj.server.requests{endpoint=s1,op=get}":                            1,
		"cuobj.server.requests{endpoint=s1,op=put}":                            1,
		"cuobj.server.bytes{endpoint=s1,op=get}":                               size,
		"cuobj.server.bytes{endpoint=s1,op=put}":                               size,
		"cuobj.server.refused{endpoint=s1}":                                    1,
		"cuobj.server.failed{endpoint=s1}":                                     0,
		"cuobj.client.requests{op=get}":                                        1,
		"cuobj.client.bytes{op=put}":                                           size,
		"cuobj.client.callbacks{}":                                             2,
		"cuobj.client.connections{}":                                           1,
		"cuobj.client.failovers{}":                                             0,
		"cuobj.events{component=cuobj-server,level=ERROR,msg=request refused}": 1,
		"cuobj.events{component=cuobj-server,level=INFO,msg=server started}":   1,
		connected: 1,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %d (present %v), want %d", k, v, ok, want)
		}
	}
}

// TestCoreHasNoOTel: package cuobj itself must not depend on OpenTelemetry
// (internal/layering checks every package; this says it where it matters).
func TestCoreHasNoOTel(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/goroce/goroce/cuobj").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "go.opentelemetry.io/") {
			t.Errorf("package cuobj depends on %s", p)
		}
	}
}
