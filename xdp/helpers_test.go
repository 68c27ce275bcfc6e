package xdp_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/xdp"
)

// testEtherType marks frames the tests send (IEEE local experimental).
const testEtherType = 0x88b5

// redirectAll loads an XDP program that sends every frame of a queue to the
// socket registered for it in an XSKMAP, and passes frames of other queues.
func redirectAll(t testing.TB, frags bool) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 8})
	if err != nil {
		skipIfNoBPF(t, err)
		t.Fatalf("XSKMAP: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	spec := &ebpf.ProgramSpec{
		Type:    ebpf.XDP,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 16, asm.Word), // xdp_md.rx_queue_index
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Imm(asm.R3, 2), // XDP_PASS when the slot is empty
			asm.FnRedirectMap.Call(),
			asm.Return(),
		},
	}
	if frags {
		spec.Flags = unix.BPF_F_XDP_HAS_FRAGS
	}
	p, err := ebpf.NewProgram(spec)
	if err != nil {
		skipIfNoBPF(t, err)
		t.Fatalf("loading XDP program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p, m
}

func skipIfNoBPF(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, unix.EPERM) {
		t.Skipf("BPF not permitted (needs CAP_BPF/CAP_SYS_ADMIN): %v", err)
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel lacks XSKMAP/XDP: %v", err)
	}
}

// side is one end of a veth pair with an AF_XDP socket on it.
type side struct {
	ns   *netnstest.NS
	veth *netnstest.Veth
	sock *xdp.Socket
	mac  []byte
}

// openSide opens an AF_XDP socket on queue 0 of v inside its namespace and
// attaches a redirect program in driver mode.
func openSide(t testing.TB, v *netnstest.Veth, cfg xdp.Config) *side {
	t.Helper()
	return openSideFrags(t, v, cfg, cfg.Multibuffer)
}

// openSideFrags is openSide with the program's frags flag chosen apart
// from the socket's multi-buffer mode.
func openSideFrags(t testing.TB, v *netnstest.Veth, cfg xdp.Config, frags bool) *side {
	t.Helper()
	prog, m := redirectAll(t, frags)
	s := &side{ns: v.NS, veth: v, mac: v.HardwareAddr}
	err := v.NS.Do(func() error {
		sock, err := xdp.Open(v.Name, 0, cfg)
		if err != nil {
			return err
		}
		s.sock = sock
		if err := m.Put(uint32(0), uint32(sock.FD())); err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: v.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		if errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP unavailable: %v", err)
		}
		t.Fatalf("open AF_XDP on %s: %v", v.Name, err)
	}
	t.Cleanup(func() { s.sock.Close() })
	return s
}

// newPair makes two namespaces joined by a veth pair with the given MTU and
// an AF_XDP socket on each end.
func newPair(t testing.TB, mtu int, cfg xdp.Config) (a, b *side) {
	t.Helper()
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: mtu})
	if err := p.VethA.WaitReady(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.VethB.WaitReady(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	return openSide(t, p.VethA, cfg), openSide(t, p.VethB, cfg)
}

// fillFrame writes a test frame of length len(f) with sequence number seq.
func fillFrame(f []byte, dst, src []byte, seq uint32) {
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], testEtherType)
	binary.BigEndian.PutUint32(f[14:18], seq)
	binary.BigEndian.PutUint32(f[18:22], uint32(len(f)))
	x := seq*2654435761 + 1
	for i := 22; i < len(f); i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		f[i] = byte(x)
	}
}

// frameLen picks a varied frame length in [60, max].
func frameLen(seq uint32, max int) int {
	switch seq % 4 {
	case 0:
		return max
	case 1:
		return 60
	}
	return 60 + int(seq*7919)%(max-60+1)
}
