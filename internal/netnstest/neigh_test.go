//go:build linux

package netnstest

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestResolveThenBurst: after Resolve, both kernels hold each other's MAC and
// a burst far larger than the unresolved-neighbour queue (about 212 KB)
// arrives whole, for every address family a pair can have.
func TestResolveThenBurst(t *testing.T) {
	for _, fam := range []struct{ name, a, b string }{
		{"IPv4", "10.99.0.1/24", "10.99.0.2/24"},
		{"IPv6", "fd99::1/64", "fd99::2/64"},
		{"IPv6-link-local", "fe80::99:1/64", "fe80::99:2/64"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			t0 := time.Now()
			p := NewPairConfig(t, VethConfig{Addr: netip.MustParsePrefix(fam.a), PeerAddr: netip.MustParsePrefix(fam.b)})
			t1 := time.Now()
			p.Resolve(t)
			t.Logf("pair %v, resolve %v", t1.Sub(t0), time.Since(t1))
			deadline := time.Now().Add(time.Second)
			if err := p.VethA.waitNeighbour(p.VethB.Addr.Addr(), p.VethB.HardwareAddr, deadline); err != nil {
				t.Fatal(err)
			}
			if err := p.VethB.waitNeighbour(p.VethA.Addr.Addr(), p.VethA.HardwareAddr, deadline); err != nil {
				t.Fatal(err)
			}

			zone := func(v *Veth) string {
				if v.Addr.Addr().IsLinkLocalUnicast() {
					return v.Name
				}
				return ""
			}
			var rx, tx *net.UDPConn
			if err := p.B.Do(func() (err error) {
				rx, err = net.ListenUDP("udp", &net.UDPAddr{IP: p.VethB.Addr.Addr().AsSlice(), Zone: zone(p.VethB)})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer rx.Close()
			// 300 × 1400 bytes: more than the unresolved queue, less than
			// the receive buffer.
			raw, _ := rx.SyscallConn()
			raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) })
			if err := p.A.Do(func() (err error) {
				tx, err = net.DialUDP("udp", nil, &net.UDPAddr{IP: p.VethB.Addr.Addr().AsSlice(), Port: rx.LocalAddr().(*net.UDPAddr).Port, Zone: zone(p.VethA)})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer tx.Close()
			const n = 300
			msg := make([]byte, 1400)
			for i := 0; i < n; i++ {
				if _, err := tx.Write(msg); err != nil {
					t.Fatalf("datagram %d: %v", i, err)
				}
			}
			rx.SetReadDeadline(time.Now().Add(5 * time.Second))
			for i := 0; i < n; i++ {
				if _, _, err := rx.ReadFromUDP(msg); err != nil {
					t.Fatalf("after %d of %d datagrams: %v", i, n, err)
				}
			}
		})
	}
}
