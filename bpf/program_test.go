//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
)

// requireBPF skips unless the process may load XDP programs and the kernel
// can load this one; it returns a loaded program closed at cleanup.
func requireBPF(t testing.TB, opts Options) *Program {
	t.Helper()
	bpfCaps := true
	for _, c := range []netnstest.Cap{unix.CAP_BPF, unix.CAP_NET_ADMIN} {
		if ok, _ := netnstest.HasCap(c); !ok {
			bpfCaps = false
		}
	}
	if sys, _ := netnstest.HasCap(unix.CAP_SYS_ADMIN); !bpfCaps && !sys {
		netnstest.RequireCaps(t, unix.CAP_BPF, unix.CAP_NET_ADMIN)
	}
	p, err := Load(opts)
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel cannot run the program: %v", err)
	}
	if err != nil {
		t.Fatalf("Load(%+v): %v", opts, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type verdict int

const (
	steer     verdict = iota // matched: redirected, or passed for want of a socket
	pass                     // not RoCEv2: passed
	otherAddr                // RoCEv2 to an address the filter does not hold: passed
)

func (v verdict) String() string { return [...]string{"steer", "pass", "other-addr"}[v] }

// sub returns the counters that moved from before to s.
func (s Stats) sub(before Stats) Stats {
	return Stats{s.Redirected - before.Redirected, s.NoSocket - before.NoSocket, s.Passed - before.Passed, s.OtherAddr - before.OtherAddr}
}

// run test-runs p on data and returns the XDP action and which counter
// moved; exactly one must.
func run(t *testing.T, p *Program, data []byte) (uint32, Stats) {
	t.Helper()
	before, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	ret, _, err := p.prog.Test(data)
	if err != nil {
		t.Fatalf("test run (%d bytes): %v", len(data), err)
	}
	after, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	d := after.sub(before)
	if d.Redirected+d.NoSocket+d.Passed+d.OtherAddr != 1 {
		t.Fatalf("counters moved by %+v for one frame", d)
	}
	return ret, d
}

func checkVerdict(t *testing.T, p *Program, data []byte, want verdict) {
	t.Helper()
	ret, d := run(t, p, data)
	if ret != xdpPass {
		t.Fatalf("action %d, want XDP_PASS (%d): no socket is registered", ret, xdpPass)
	}
	got := pass
	switch {
	case d.NoSocket == 1:
		got = steer
	case d.OtherAddr == 1:
		got = otherAddr
	}
	if got != want {
		t.Fatalf("verdict %v, want %v (counters %+v) for % x", got, want, d, data)
	}
}

func frameCases() []struct {
	name string
	f    frame
	want verdict
} {
	return []struct {
		name string
		f    frame
		want verdict
	}{
		{"ipv4-udp-4791", frame{payload: 64}, steer},
		{"ipv4-udp-4791-empty", frame{}, steer},
		{"ipv4-vlan", frame{tags: []uint16{0x8100}, payload: 32}, steer},
		{"ipv4-qinq-88a8", frame{tags: []uint16{0x88a8, 0x8100}, payload: 32}, steer},
		{"ipv4-88a8-only", frame{tags: []uint16{0x88a8}}, steer},
		{"ipv4-three-tags", frame{tags: []uint16{0x88a8, 0x8100, 0x8100}}, pass},
		{"ipv6-udp-4791", frame{ipv6: true, payload: 64}, steer},
		{"ipv6-vlan", frame{ipv6: true, tags: []uint16{0x8100}}, steer},
		{"ipv6-ext-header", frame{ipv6: true, extHdr: true}, pass},
		{"ipv6-bad-version", frame{ipv6: true, version: 4}, pass},
		{"ipv4-bad-version", frame{version: 6}, pass},
		{"ipv4-ihl-4", frame{ihl: 4}, pass},
		{"ipv4-udp-other-port", frame{dport: 4792}, pass},
		{"ipv4-udp-src-4791", frame{sport: 4791, dport: 5000}, pass},
		{"ipv4-udp-port-byteswapped", frame{dport: 0xb712}, pass},
		{"ipv4-tcp-4791", frame{proto: 6, payload: 10}, pass},
		{"ipv4-icmp", frame{proto: 1}, pass},
		{"ipv6-tcp-4791", frame{ipv6: true, proto: 6}, pass},
		{"ipv6-icmpv6-nd", frame{ipv6: true, proto: 58}, pass},
		{"arp", frame{ethType: 0x0806}, pass},
		{"vlan-arp", frame{tags: []uint16{0x8100}, ethType: 0x0806}, pass},
		{"unknown-ethertype", frame{ethType: 0x88b5}, pass},
		{"ipv4-mf", frame{fragment: 0x2000}, pass},
		{"ipv4-frag-offset", frame{fragment: 0x0010}, pass},
		{"ipv4-no-df", frame{fragment: 0x8000}, steer}, // reserved bit only,
		// Options: the port must be read after them. With IHL 6 the
		// option word holds what would be the port if IHL were ignored.
		{"ipv4-options-ihl6", frame{ihl: 6, optFill: []byte{0, 0, 0x12, 0xb7}, dport: 4791}, steer},
		{"ipv4-options-misread", frame{ihl: 6, optFill: []byte{0xc0, 0, 0x12, 0xb7}, dport: 80}, pass},
		{"ipv4-options-ihl15", frame{ihl: 15, payload: 8}, steer},
		{"ipv4-options-ihl15-other", frame{ihl: 15, dport: 53}, pass},
		{"ipv4-options-vlan", frame{tags: []uint16{0x8100}, ihl: 8}, steer},
	}
}

func TestVerdicts(t *testing.T) {
	for _, frags := range []bool{false, true} {
		t.Run(fmt.Sprintf("frags=%v", frags), func(t *testing.T) {
			p := requireBPF(t, Options{Frags: frags})
			for _, tc := range frameCases() {
				t.Run(tc.name, func(t *testing.T) {
					checkVerdict(t, p, tc.f.bytes(), tc.want)
				})
			}
		})
	}
}

func TestPortOption(t *testing.T) {
	p := requireBPF(t, Options{Port: 18515})
	checkVerdict(t, p, frame{dport: 18515}.bytes(), steer)
	checkVerdict(t, p, frame{ipv6: true, dport: 18515}.bytes(), steer)
	checkVerdict(t, p, frame{}.bytes(), pass)
	if got := p.Options().Port; got != 18515 {
		t.Fatalf("Options().Port %d", got)
	}
}

// TestTruncated cuts matching frames at every length: the verifier has
// accepted the program, and every cut before the end of the UDP header must
// pass while longer ones are steered.
func TestTruncated(t *testing.T) {
	p := requireBPF(t, Options{})
	for _, f := range []frame{
		{payload: 16},
		{tags: []uint16{0x88a8, 0x8100}, payload: 16},
		{ipv6: true, payload: 16},
		{ipv6: true, tags: []uint16{0x8100}, payload: 16},
		{ihl: 15, payload: 16},
	} {
		full := f.bytes()
		hdr := f.headerLen()
		for n := 0; n <= len(full); n++ {
			data := full[:n]
			if n < 14 {
				// BPF_PROG_TEST_RUN refuses XDP input shorter than an
				// Ethernet header; it must not run the program.
				if _, _, err := p.prog.Test(data); err == nil && n > 0 {
					t.Logf("kernel ran the program on %d bytes", n)
				}
				continue
			}
			want := pass
			if n >= hdr {
				want = steer
			}
			t.Run(fmt.Sprintf("tags%d-v6=%v-ihl%d/%d", len(f.tags), f.ipv6, f.ihl, n), func(t *testing.T) {
				checkVerdict(t, p, data, want)
			})
		}
	}
}

// TestGarbage runs frames of random bytes with the EtherType forced to IP:
// the program must return XDP_PASS or steer, never fail.
func TestGarbage(t *testing.T) {
	p := requireBPF(t, Options{})
	seed := uint32(1)
	rnd := func() byte { seed = seed*1664525 + 1013904223; return byte(seed >> 24) }
	for i := range 2000 {
		data := make([]byte, 14+int(rnd())%100)
		for j := range data {
			data[j] = rnd()
		}
		if i%2 == 0 {
			data[12], data[13] = 0x08, 0x00
		} else {
			data[12], data[13] = 0x86, 0xdd
		}
		ret, _ := run(t, p, data)
		if ret != xdpPass {
			t.Fatalf("action %d on % x", ret, data)
		}
	}
}

func TestLoadOptions(t *testing.T) {
	p := requireBPF(t, Options{})
	o := p.Options()
	if o.Port != DefaultPort || o.Queues != DefaultQueues || o.Frags {
		t.Fatalf("defaults %+v", o)
	}
	for _, q := range []int{-1, maxQueues + 1} {
		if _, err := Load(Options{Queues: q}); !errors.Is(err, ErrQueueRange) {
			t.Errorf("Load(Queues: %d): %v, want ErrQueueRange", q, err)
		}
	}
	if id, err := p.ID(); err != nil || id == 0 {
		t.Fatalf("ID %d, %v", id, err)
	}
}

func TestRegisterBadInput(t *testing.T) {
	p := requireBPF(t, Options{Queues: 4})
	for _, q := range []int{-1, 4, 1 << 20} {
		if err := p.Register(q, 3); !errors.Is(err, ErrQueueRange) {
			t.Errorf("Register(%d): %v, want ErrQueueRange", q, err)
		}
		if err := p.Unregister(q); !errors.Is(err, ErrQueueRange) {
			t.Errorf("Unregister(%d): %v, want ErrQueueRange", q, err)
		}
	}
	if err := p.Register(0, -1); err == nil {
		t.Error("Register with fd -1 succeeded")
	}
	// A UDP socket is not an AF_XDP socket.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := p.Register(0, fd); err == nil {
		t.Error("Register with a UDP socket succeeded")
	} else {
		t.Logf("Register(UDP socket): %v", err)
	}
	if err := p.Unregister(1); err != nil {
		t.Errorf("Unregister of an empty slot: %v", err)
	}
}

func TestClosed(t *testing.T) {
	p := requireBPF(t, Options{})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Register(0, 3); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close: %v", err)
	}
	if err := p.Unregister(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Unregister after Close: %v", err)
	}
	if _, err := p.Stats(); !errors.Is(err, ErrClosed) {
		t.Errorf("Stats after Close: %v", err)
	}
	if _, err := p.Attach(1, AttachAuto); !errors.Is(err, ErrClosed) {
		t.Errorf("Attach after Close: %v", err)
	}
}

// BenchmarkProgram measures the program in the kernel (BPF_PROG_TEST_RUN
// with repeat): ns/op is the in-kernel time per frame.
func BenchmarkProgram(b *testing.B) {
	for _, bc := range []struct {
		name string
		f    frame
	}{
		{"ipv4-roce", frame{payload: 1024}},
		{"qinq-ipv6-roce", frame{tags: []uint16{0x88a8, 0x8100}, ipv6: true, payload: 1024}},
		{"ipv4-tcp", frame{proto: 6, payload: 1024}},
		{"arp", frame{ethType: 0x0806}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := requireBPF(b, Options{})
			data := bc.f.bytes()
			b.ReportAllocs()
			_, per, err := p.prog.Benchmark(data, b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "kernel-ns/frame")
		})
	}
}

func TestUnsupportedError(t *testing.T) {
	err := fmt.Errorf("load XDP program: %w", &UnsupportedError{Feature: "XDP frags (BPF_F_XDP_HAS_FRAGS)", MinKernel: "5.18", Err: unix.EINVAL})
	if !errors.Is(err, ebpf.ErrNotSupported) || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("%v does not match ErrNotSupported and EINVAL", err)
	}
	want := "load XDP program: bpf: XDP frags (BPF_F_XDP_HAS_FRAGS) not supported (requires Linux 5.18 or later): invalid argument"
	if err.Error() != want {
		t.Fatalf("got %q\nwant %q", err, want)
	}
	if !haveFrags() {
		t.Log("kernel has no XDP frags")
	}
}
