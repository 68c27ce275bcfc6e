//go:build linux

package netnstest

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// Resolve makes each end of the veth pair a–b know the other's MAC address
// before a test sends its first burst. Linux queues only about 212 KB
// (unres_qlen_bytes) for a neighbour still being resolved and drops the
// rest, so a batch sent before ARP or neighbour discovery has finished loses
// frames when the machine is busy. Resolve pings a's peer address from a and
// back, as a user would check a new link, and waits until both kernels hold
// a valid neighbour entry; it fails the test if that does not happen within
// timeout, which is then a real fault of the link setup.
func Resolve(t testing.TB, a, b *Veth, timeout time.Duration) {
	t.Helper()
	if err := resolve(a, b, timeout); err != nil {
		t.Fatal(err)
	}
}

// Resolve resolves the pair's neighbours both ways; see [Resolve].
func (p *Pair) Resolve(t testing.TB) {
	t.Helper()
	Resolve(t, p.VethA, p.VethB, 10*time.Second)
}

func resolve(a, b *Veth, timeout time.Duration) error {
	if !a.Addr.IsValid() || !b.Addr.IsValid() {
		return fmt.Errorf("netnstest: resolve %s–%s: both ends need an address", a.Name, b.Name)
	}
	deadline := time.Now().Add(timeout)
	for _, d := range [][2]*Veth{{a, b}, {b, a}} {
		from, to := d[0], d[1]
		dst := to.Addr.Addr()
		if dst.Is6() && dst.IsLinkLocalUnicast() {
			dst = dst.WithZone(from.Name)
		}
		if err := from.NS.Ping(dst, time.Until(deadline)); err != nil {
			return fmt.Errorf("netnstest: resolve %v from %s: %w", dst, from.Name, err)
		}
	}
	// The echo replies prove the entries exist; wait in case a reply
	// overtook the neighbour update, and report the state if it is not valid.
	for _, d := range [][2]*Veth{{a, b}, {b, a}} {
		if err := d[0].waitNeighbour(d[1].Addr.Addr(), d[1].HardwareAddr, deadline); err != nil {
			return err
		}
	}
	return nil
}

// nudValid is the kernel's NUD_VALID: states in which an entry's MAC is used
// without queueing.
const nudValid = netlink.NUD_PERMANENT | netlink.NUD_NOARP | netlink.NUD_REACHABLE |
	netlink.NUD_PROBE | netlink.NUD_STALE | netlink.NUD_DELAY

// waitNeighbour waits until v's namespace holds a valid neighbour entry for
// ip on v with the given MAC.
func (v *Veth) waitNeighbour(ip netip.Addr, mac []byte, deadline time.Time) error {
	family := netlink.FAMILY_V4
	if ip.Is6() && !ip.Is4In6() {
		family = netlink.FAMILY_V6
	}
	ip = ip.Unmap().WithZone("")
	state := "absent"
	for {
		neighs, err := v.NS.nl.NeighList(v.Index, family)
		if err != nil {
			return fmt.Errorf("netnstest: list neighbours of %s: %w", v.Name, err)
		}
		for _, n := range neighs {
			nip, _ := netip.AddrFromSlice(n.IP)
			if nip.Unmap() != ip {
				continue
			}
			state = fmt.Sprintf("state %#x lladdr %v", n.State, n.HardwareAddr)
			if n.State&nudValid != 0 && string(n.HardwareAddr) == string(mac) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netnstest: no valid neighbour entry for %v on %s (%s)", ip, v.Name, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
