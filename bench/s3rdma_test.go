//go:build linux

package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3gw"
	"github.com/goroce/goroce/cuobj/s3rdma"
	"github.com/goroce/goroce/internal/looppair"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

var (
	s3rdmaSize   = flag.Int("s3rdmabench.size", 16<<20, "TestS3RDMATable object size in bytes (the issue's figure: 268435456)")
	s3rdmaRounds = flag.Int("s3rdmabench.rounds", 1, "TestS3RDMATable rounds, the cases taking turns (the table shows medians)")
	s3rdmaProto  = flag.String("s3rdmabench.proto", "rc", "TestS3RDMATable transport of the RDMA cases: rc or dc (perf runs over RC either way)")
	s3rdmaLink   = flag.String("s3rdmabench.link", "udp", "TestS3RDMATable link: udp (kernel UDP on loopback) or xdp (AF_XDP between two network namespaces over veth; root)")
)

// TestS3RDMATable measures, in one run and on one pair of goroce devices
// on kernel UDP sockets on loopback (the embedded link of rocectl cuobj):
// an object's RDMA PUT (server RDMA READ) and RDMA GET (server RDMA
// WRITE) through the cuobj/s3gw gateway with the cuobj/s3rdma client,
// beside the same object's plain SigV4-signed HTTP PUT and GET to the
// same gateway, and the link's own rocectl perf read-bw and write-bw
// --loopback (64 KiB messages). The cases take turns round by round; the
// table shows medians and the ratios of the RDMA figures to the others.
//
//	go test ./bench -run TestS3RDMATable -count=1 -v -args -s3rdmabench.size=268435456 -s3rdmabench.rounds=3
//
// -s3rdmabench.proto=dc moves the RDMA cases over DC instead of RC.
//
// -s3rdmabench.link=xdp runs the same table between two network
// namespaces joined by a veth (MTU 9000): the gateway and its cuobj.Server
// on one end's AF_XDP device, the client on the other's; the plain HTTP
// over kernel TCP across the same veth, the gateway listening on its veth
// address; perf read-bw and write-bw in-process on the same two AF_XDP
// devices. A veth between namespaces is the nearest this machine has to
// two hosts: RoCE over AF_XDP and TCP both through the same device pair,
// where on loopback both ends of each sit on lo.
//
//	go test ./bench -run TestS3RDMATable -count=1 -v -args -s3rdmabench.link=xdp -s3rdmabench.size=67108864 -s3rdmabench.rounds=3
func TestS3RDMATable(t *testing.T) {
	size := *s3rdmaSize
	proto := map[string]cuobj.Proto{"rc": cuobj.ProtoRC, "dc": cuobj.ProtoDC}[*s3rdmaProto]
	if proto == 0 {
		t.Fatalf("-s3rdmabench.proto %q: rc or dc", *s3rdmaProto)
	}
	if size <= 0 || size > s3gw.DefaultMaxObjectSize {
		t.Fatalf("-s3rdmabench.size %d outside 1 … %d", size, s3gw.DefaultMaxObjectSize)
	}
	var rig s3rig
	switch *s3rdmaLink {
	case "udp":
		rig = s3LoopRig(t)
	case "xdp":
		rig = s3VethRig(t)
	default:
		t.Fatalf("-s3rdmabench.link %q: udp or xdp", *s3rdmaLink)
	}
	sdev, cdev, srvIP := rig.sdev, rig.cdev, rig.srvIP
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	off := &cuobj.Telemetry{Off: true}
	rs, err := cuobj.NewServer(sdev, netip.AddrPortFrom(srvIP, 18515), cuobj.ServerOptions{Telemetry: off, Proto: proto})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bucket"), 0o755); err != nil {
		t.Fatal(err)
	}
	creds := s3rdma.Credentials{AccessKey: "GRBENCHKEY0000000002", SecretKey: "bench-secret-0123456789abcdefghijklmnopq"}
	g, err := s3gw.New(s3gw.Options{Dir: dir, RDMA: rs, AccessKey: creds.AccessKey, SecretKey: creds.SecretKey})
	if err != nil {
		t.Skipf("no gateway on a temporary directory: %v", err)
	}
	ln, err := rig.listen()
	if err != nil {
		g.Close()
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() { g.Close() })
	endpoint := "http://" + ln.Addr().String()
	cfg := cuobj.DefaultConfig()
	c, err := s3rdma.NewClient(cdev, endpoint, s3rdma.ClientOptions{HTTP: rig.http, Credentials: creds, RDMA: cuobj.ClientOptions{Config: &cfg, Telemetry: off, Proto: proto}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	obj := make([]byte, size)
	for i := range obj {
		obj[i] = byte(i*7 + i>>12)
	}
	buf := make([]byte, size)
	if err := c.RDMA().Register(obj); err != nil {
		t.Fatal(err)
	}
	if err := c.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	plain := &plainS3{url: endpoint, http: rig.http, creds: aws.Credentials{AccessKeyID: creds.AccessKey, SecretAccessKey: creds.SecretKey},
		signer: v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })}
	check := func(what string, got []byte) {
		if !bytes.Equal(got, obj) {
			t.Fatalf("%s: the object differs from what was put", what)
		}
	}
	// Each case's rate, and the CPU time the process (both ends, the
	// gateway and its file I/O) spent per GB: on a loaded machine the
	// rate is what the process was given, the CPU what the path costs.
	cpuPerGB := map[string][]float64{}
	timed := func(what string, f func() error) float64 {
		start, cpu0 := time.Now(), cpuTime(syscall.RUSAGE_SELF)
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		el := time.Since(start)
		cpuPerGB[what] = append(cpuPerGB[what], (cpuTime(syscall.RUSAGE_SELF)-cpu0).Seconds()/(float64(size)/1e9))
		return float64(size) / el.Seconds() / 1e6
	}
	perf := func(v perftest.Verb) float64 {
		const msg, iters = 65536, 5000
		cpu0 := cpuTime(syscall.RUSAGE_SELF)
		res, err := rig.perf(ctx, perfrun.PerfConfig{Verb: v, Size: msg, Iters: iters, Gbits: true, GIDIndex: -1})
		if err != nil || len(res) == 0 || res[0].BW == nil {
			t.Fatalf("perf %v (%s): %v", v, rig.perfName, err)
		}
		// Setup and teardown included: a little over the transfer's own.
		cpuPerGB[v.String()] = append(cpuPerGB[v.String()], (cpuTime(syscall.RUSAGE_SELF)-cpu0).Seconds()/(msg*iters/1e9))
		return res[0].BW.BWAvg * 1e3 / 8 // Gb/s to MB/s
	}

	fig := map[string][]float64{}
	add := func(k string, v float64) { fig[k] = append(fig[k], v) }
	rounds := max(*s3rdmaRounds, 1)
	fmt.Printf("TestS3RDMATable: %d-byte objects, %d rounds, RDMA over %s, %s, path MTU %d, load average %s\n", size, rounds, *s3rdmaProto, rig.name, sdev.QueryPort().ActiveMTU.Bytes(), loadAvg())
	for round := range rounds {
		add("rdma put", timed("RDMA PUT", func() error {
			byRDMA, err := c.Put(ctx, "bucket", "rdma", obj)
			if err == nil && !byRDMA {
				err = fmt.Errorf("not by RDMA")
			}
			return err
		}))
		add("http put", timed("HTTP PUT", func() error { return plain.put(ctx, "bucket/http", obj) }))
		add("perf read", perf(perftest.Read))
		clear(buf)
		add("rdma get", timed("RDMA GET", func() error {
			n, byRDMA, err := c.Get(ctx, "bucket", "rdma", buf)
			if err == nil && (!byRDMA || n != int64(size)) {
				err = fmt.Errorf("%d bytes, by RDMA %v", n, byRDMA)
			}
			return err
		}))
		check("RDMA GET", buf)
		var got []byte
		add("http get", timed("HTTP GET", func() (err error) { got, err = plain.get(ctx, "bucket/http", size); return err }))
		check("HTTP GET", got)
		add("perf write", perf(perftest.Write))
		fmt.Printf("round %d: RDMA PUT %.0f MB/s, HTTP PUT %.0f, read-bw %.0f; RDMA GET %.0f, HTTP GET %.0f, write-bw %.0f\n", round+1,
			fig["rdma put"][round], fig["http put"][round], fig["perf read"][round],
			fig["rdma get"][round], fig["http get"][round], fig["perf write"][round])
	}
	m := func(k string) float64 { return median(fig[k]) }
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	cpu := func(k string) float64 { return median(cpuPerGB[k]) }
	fmt.Fprintf(tw, "op\tRDMA MB/s\tsigned HTTP MB/s\tRDMA/HTTP\tperf %s MB/s\tRDMA/perf\tCPU s/GB RDMA\tHTTP\tperf\t\n", rig.perfName)
	fmt.Fprintf(tw, "PUT (server READ)\t%.0f\t%.0f\t%.2f×\tread-bw %.0f\t%.2f×\t%.2f\t%.2f\t%.2f\t\n", m("rdma put"), m("http put"), m("rdma put")/m("http put"),
		m("perf read"), m("rdma put")/m("perf read"), cpu("RDMA PUT"), cpu("HTTP PUT"), cpu(perftest.Read.String()))
	fmt.Fprintf(tw, "GET (server WRITE)\t%.0f\t%.0f\t%.2f×\twrite-bw %.0f\t%.2f×\t%.2f\t%.2f\t%.2f\t\n", m("rdma get"), m("http get"), m("rdma get")/m("http get"),
		m("perf write"), m("rdma get")/m("perf write"), cpu("RDMA GET"), cpu("HTTP GET"), cpu(perftest.Write.String()))
	tw.Flush()
	fmt.Printf("targets: RDMA/HTTP ≥ 3×, RDMA/perf ≥ 0.8×; load average at end %s\n", loadAvg())
}

// s3rig is where TestS3RDMATable runs: the two devices, the gateway's
// address, its HTTP listener and client, and the link's own perf.
type s3rig struct {
	name       string // the link, for the table's heading
	sdev, cdev *roce.Device
	srvIP      netip.Addr
	listen     func() (net.Listener, error) // the gateway's HTTP listener
	http       *http.Client                 // nil: http.DefaultClient
	perfName   string
	perf       func(ctx context.Context, cfg perfrun.PerfConfig) ([]perfrun.PerfResult, error) // the client's results
}

// s3LoopRig is the pair of devices on kernel UDP sockets on loopback, the
// gateway on 127.0.0.1, and perf --loopback (its own pair, as rocectl's).
func s3LoopRig(t *testing.T) s3rig {
	pfx := looppair.Prefix()
	srvIP, cliIP := netip.AddrFrom4([4]byte{pfx[0], pfx[1], pfx[2], 1}), netip.AddrFrom4([4]byte{pfx[0], pfx[1], pfx[2], 2})
	sdev, cdev := looppair.PairMTU(t, []netip.Addr{srvIP}, cliIP, loMTU())
	return s3rig{
		name: "kernel UDP link on loopback", sdev: sdev, cdev: cdev, srvIP: srvIP,
		listen:   func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") },
		perfName: "--loopback",
		perf: func(ctx context.Context, cfg perfrun.PerfConfig) ([]perfrun.PerfResult, error) {
			res, _, err := perfrun.Loopback(ctx, cfg, io.Discard, false)
			return res, err
		},
	}
}

// s3VethRig is a veth pair between two network namespaces: the server's
// AF_XDP device in B, the client's in A. The gateway listens on B's veth
// address from inside B, and the HTTP client dials from inside A, so its
// bodies cross the veth over kernel TCP. perf runs in-process on the same
// two devices, its out-of-band TCP likewise across the veth.
func s3VethRig(t *testing.T) s3rig {
	netnstest.RequireRoot(t)
	p := readyPair(t)
	sdev, cdev := openXDP(t, p.VethB), openXDP(t, p.VethA)
	srvIP := p.VethB.Addr.Addr()
	listenB := func() (ln net.Listener, err error) {
		err = p.B.Do(func() (err error) {
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(srvIP, 0).String())
			return err
		})
		return ln, err
	}
	// A socket belongs to the namespace it was made in, whichever thread
	// uses it later.
	dialA := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = p.A.Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: 20 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy, tr.DialContext = nil, dialA
	hc := &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	return s3rig{
		name: fmt.Sprintf("AF_XDP link between two namespaces over veth (MTU %d)", vethMTU), sdev: sdev, cdev: cdev, srvIP: srvIP,
		listen: listenB, http: hc, perfName: "AF_XDP",
		perf: func(ctx context.Context, cfg perfrun.PerfConfig) ([]perfrun.PerfResult, error) {
			ln, err := listenB()
			if err != nil {
				return nil, err
			}
			defer ln.Close()
			type res struct {
				r   []perfrun.PerfResult
				err error
			}
			srv := make(chan res, 1)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() {
				scfg := cfg
				scfg.Device = p.VethB.Name
				r, err := perfrun.Perf(ctx, sdev, perfrun.OOB{Listener: ln}, scfg, io.Discard, false)
				if err != nil {
					cancel()
				}
				srv <- res{r, err}
			}()
			cfg.Device = p.VethA.Name
			addr := ln.Addr().String()
			r, err := perfrun.Perf(ctx, cdev, perfrun.OOB{Dial: func(ctx context.Context) (net.Conn, error) { return dialA(ctx, "tcp4", addr) }}, cfg, io.Discard, false)
			if err != nil {
				cancel()
			}
			s := <-srv
			switch {
			case err != nil:
				return nil, fmt.Errorf("client: %w", err)
			case s.err != nil:
				return nil, fmt.Errorf("server: %w", s.err)
			}
			return r, nil
		},
	}
}

// loMTU is lo's MTU: the links of the table's pair report it, as the
// links of perf --loopback, bound to loopback addresses, do (a wildcard's
// 1500 would make the path MTU 1024 against perf's 4096: four times the
// packets per byte).
func loMTU() int {
	if lo, err := net.InterfaceByName("lo"); err == nil {
		return lo.MTU
	}
	return 65536
}

// plainS3 sends SigV4-signed PUTs and GETs whose bodies go over HTTP, as
// any S3 client does (the payload hashed and signed).
type plainS3 struct {
	url    string
	http   *http.Client // nil: http.DefaultClient
	creds  aws.Credentials
	signer *v4.Signer
}

func (p *plainS3) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, p.url+"/"+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	sum := sha256.Sum256(body)
	h := hex.EncodeToString(sum[:])
	req.Header.Set("X-Amz-Content-Sha256", h)
	if err := p.signer.SignHTTP(ctx, p.creds, req, h, "s3", s3gw.DefaultRegion, time.Now()); err != nil {
		return nil, err
	}
	hc := p.http
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %s %s", method, path, resp.Status, b)
	}
	return resp, nil
}

func (p *plainS3) put(ctx context.Context, path string, body []byte) error {
	resp, err := p.do(ctx, http.MethodPut, path, body)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func (p *plainS3) get(ctx context.Context, path string, size int) ([]byte, error) {
	resp, err := p.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b := bytes.NewBuffer(make([]byte, 0, size))
	_, err = b.ReadFrom(resp.Body)
	return b.Bytes(), err
}
