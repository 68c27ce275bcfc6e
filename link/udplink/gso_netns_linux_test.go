package udplink

import (
	"bytes"
	"errors"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
)

// TestGSOBetweenNamespaces sends runs of real RoCEv2 frames over a veth
// pair. With segmentation on the veth (the default) a run crosses whole
// and the receiver splits it; with tx-udp-segmentation off the kernel cuts
// it before the veth, and a capture there shows what a peer would get:
// every datagram exactly as built, ICRC valid over its wire header. IPv4
// runs are not sent to a remote peer at all (their segments would carry
// IDs 0, 1, 2, ...).
func TestGSOBetweenNamespaces(t *testing.T) {
	netnstest.RequireRoot(t)
	for _, fam := range []struct {
		name, a, b string
		runs       bool
	}{
		{"IPv4", "10.98.0.1/24", "10.98.0.2/24", false},
		{"IPv6", "fd98::1/64", "fd98::2/64", true},
	} {
		for _, cut := range []bool{false, true} {
			name := fam.name + "/whole"
			if cut {
				name = fam.name + "/cut"
			}
			t.Run(name, func(t *testing.T) {
				p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500,
					Addr: netip.MustParsePrefix(fam.a), PeerAddr: netip.MustParsePrefix(fam.b)})
				p.Resolve(t)
				if cut {
					if _, err := exec.LookPath("ethtool"); err != nil {
						t.Skip("ethtool not installed")
					}
					if err := p.A.Run(exec.Command("ethtool", "-K", p.VethA.Name, "tx-udp-segmentation", "off")); err != nil {
						t.Skipf("ethtool -K tx-udp-segmentation off: %v", err)
					}
				}
				gsoBetween(t, p, fam.runs, cut)
			})
		}
	}
}

func gsoBetween(t *testing.T, p *netnstest.Pair, runs, capture bool) {
	var a, b *Link
	fd := -1
	if err := p.A.Do(func() (err error) {
		a, err = Listen(netip.AddrPortFrom(p.VethA.Addr.Addr(), 0))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := p.B.Do(func() (err error) {
		if capture {
			if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
				return err
			}
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: p.VethB.Index}); err != nil {
				return err
			}
		}
		b, err = Listen(netip.AddrPortFrom(p.VethB.Addr.Addr(), 0))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if fd >= 0 {
		defer unix.Close(fd)
	}
	requireOffloads(t, a)

	const n = 40
	sent := make([][]byte, n)
	for i := range sent {
		sent[i] = rocev2(t, a.LocalAddr(), b.LocalAddr(), 0, i)
	}
	if k, err := a.WriteBatch(sent); k != n || err != nil {
		t.Fatalf("WriteBatch = %d, %v", k, err)
	}
	got := collect(t, b, a.LocalAddr(), n, 5*time.Second)
	for i, f := range got {
		pf, _ := link.ParseFrame(f)
		sf, _ := link.ParseFrame(sent[i])
		if !bytes.Equal(f[pf.Payload:pf.End], sent[i][sf.Payload:sf.End]) {
			t.Fatalf("frame %d altered", i)
		}
		if err := ib.VerifyFrameICRC(f); err != nil {
			t.Fatalf("received frame %d: %v", i, err)
		}
	}
	st, rt := a.Stats(), b.Stats()
	if (st.GSOSends > 0) != runs {
		t.Fatalf("sender stats %+v, want runs %v", st, runs)
	}
	if (rt.GROBuffers > 0) != (runs && !capture) {
		t.Fatalf("receiver stats %+v", rt)
	}
	if !capture {
		return
	}
	tv := unix.Timeval{Usec: 100000}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 70000)
	seen := 0
	for deadline := time.Now().Add(3 * time.Second); seen < n && time.Now().Before(deadline); {
		k, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		wire := buf[:k]
		pf, err := link.ParseFrame(wire)
		if err != nil || pf.DstPort != b.LocalAddr().Port() {
			continue
		}
		if err := ib.VerifyFrameICRC(wire); err != nil {
			t.Fatalf("datagram %d on the wire (%d bytes): %v", seen, k, err)
		}
		i := int(ib.BTH(wire[pf.Payload:]).PSN()) % n
		sf, _ := link.ParseFrame(sent[i])
		if !bytes.Equal(wire[pf.Payload:pf.End], sent[i][sf.Payload:sf.End]) {
			t.Fatalf("datagram %d differs on the wire", i)
		}
		if pf.Version == 4 && wire[pf.IPOffset+4]|wire[pf.IPOffset+5] != 0 {
			t.Fatalf("datagram %d: IPv4 ID % x on the wire", i, wire[pf.IPOffset+4:pf.IPOffset+6])
		}
		seen++
	}
	if seen < n {
		t.Fatalf("captured %d of %d datagrams", seen, n)
	}
}

// TestGSOTooLarge: the kernel refuses a run whose segments exceed the
// path MTU (EINVAL, not EMSGSIZE); resent one by one, the first datagram
// is refused as too large, which is the error WriteBatch reports, at its
// index. GSO stays on: the run failed for its size, not for GSO.
func TestGSOTooLarge(t *testing.T) {
	netnstest.RequireRoot(t)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500,
		Addr: netip.MustParsePrefix("fd97::1/64"), PeerAddr: netip.MustParsePrefix("fd97::2/64")})
	p.Resolve(t)
	var a, b *Link
	for _, e := range []struct {
		ns *netnstest.NS
		v  *netnstest.Veth
		l  **Link
	}{{p.A, p.VethA, &a}, {p.B, p.VethB, &b}} {
		if err := e.ns.Do(func() (err error) {
			*e.l, err = Listen(netip.AddrPortFrom(e.v.Addr.Addr(), 0))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer (*e.l).Close()
	}
	requireOffloads(t, a)
	const maxPayload = 1500 - 40 - 8
	sizes := []int{1000, 1000, maxPayload + 1, maxPayload + 1, 1000}
	var frames [][]byte
	for i, s := range sizes {
		frames = append(frames, mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(i, s)))
	}
	n, err := a.WriteBatch(frames)
	var fe *link.FrameError
	if n != 2 || !errors.As(err, &fe) || fe.Index != 2 || !errors.Is(err, link.ErrTooLarge) {
		t.Fatalf("WriteBatch = %d, %v; want 2 and ErrTooLarge at index 2", n, err)
	}
	if st := a.Stats(); !st.GSO || st.GSOFallbacks != 1 || st.GSOSends != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The rest of the batch, as the device sends it after skipping the
	// refused frame.
	if n, err := a.WriteBatch(frames[4:]); n != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	got := collect(t, b, a.LocalAddr(), 3, 5*time.Second)
	for i, want := range []int{0, 1, 4} {
		pf, _ := link.ParseFrame(got[i])
		if !bytes.Equal(got[i][pf.Payload:pf.End], payload(want, sizes[want])) {
			t.Fatalf("frame %d altered", want)
		}
	}
}
