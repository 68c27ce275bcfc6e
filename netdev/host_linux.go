package netdev

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/roce"
)

// host is the roce.Host of one interface of one network namespace: it lists
// and follows the interface's addresses, MTU and carrier and its kernel
// neighbour table through rtnetlink, and resolves neighbours there.
type host struct {
	ifname  string
	ifindex int
	ns      netns.NsHandle
	h       *netlink.Handle
	// Sockets opened in the namespace to provoke neighbour resolution by
	// sending a throwaway datagram when netlink cannot (-1 if unavailable).
	sock4, sock6 int

	done     chan struct{}
	closeOne sync.Once
	wg       sync.WaitGroup
}

// openHost binds to ifname in the calling thread's network namespace.
func openHost(ifname string) (_ *host, err error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("netdev: network namespace: %w", err)
	}
	w := &host{ifname: ifname, ns: ns, sock4: -1, sock6: -1, done: make(chan struct{})}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.h, err = netlink.NewHandleAt(ns); err != nil {
		return nil, fmt.Errorf("netdev: netlink: %w", err)
	}
	l, err := w.h.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("netdev: interface %q: %w", ifname, err)
	}
	w.ifindex = l.Attrs().Index
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0); err == nil {
		w.sock4 = fd
	}
	if fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0); err == nil {
		w.sock6 = fd
	}
	return w, nil
}

// Close stops the address watcher and releases the handles.
func (w *host) Close() error {
	w.closeOne.Do(func() {
		close(w.done)
		w.wg.Wait()
		if w.h != nil {
			w.h.Close()
		}
		if w.sock4 >= 0 {
			unix.Close(w.sock4)
		}
		if w.sock6 >= 0 {
			unix.Close(w.sock6)
		}
		w.ns.Close()
	})
	return nil
}

// addrs lists the interface's addresses: IPv4 first, then IPv6, each in
// kernel order.
func (w *host) addrs() ([]netip.Addr, error) {
	l, err := w.h.LinkByIndex(w.ifindex)
	if err != nil {
		return nil, err
	}
	list, err := w.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		out = append(out, ip.Unmap())
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Is4() && !out[j].Is4() })
	return out, nil
}

// Follow subscribes to the interface's address, link and neighbour changes
// (roce.Host): the addresses are reported at once, the rest as they change.
func (w *host) Follow(ctx context.Context, ev roce.HostEvents) error {
	if err := w.watchAddrs(ctx, ev.AddrsChanged); err != nil {
		return err
	}
	if err := w.watchLink(ctx, ev.LinkChanged); err != nil {
		return err
	}
	return w.watchNeigh(ctx, ev.NeighbourChanged)
}

// watchAddrs calls fn with the current address list now and after every
// address change of the interface, until ctx ends or the watch is closed.
func (w *host) watchAddrs(ctx context.Context, fn func([]netip.Addr)) error {
	ch := make(chan netlink.AddrUpdate, 64)
	ns := w.ns
	err := netlink.AddrSubscribeWithOptions(ch, w.done, netlink.AddrSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: func(error) {},
	})
	if err != nil {
		return fmt.Errorf("netdev: address subscription: %w", err)
	}
	addrs, err := w.addrs()
	if err != nil {
		return fmt.Errorf("netdev: addresses of %s: %w", w.ifname, err)
	}
	fn(addrs)
	pump(w, ctx, ch, func(u netlink.AddrUpdate) {
		if u.LinkIndex != w.ifindex {
			return
		}
		// Coalesce a burst of updates into one re-listing.
		for more := true; more; {
			select {
			case _, ok := <-ch:
				if !ok {
					more = false
				}
			default:
				more = false
			}
		}
		if a, err := w.addrs(); err == nil {
			fn(a)
		}
	})
	return nil
}

// watchLink calls fn with the interface's MTU and operational state after
// every link change, until ctx ends or the watch is closed.
func (w *host) watchLink(ctx context.Context, fn func(mtu int, up bool)) error {
	ch := make(chan netlink.LinkUpdate, 16)
	ns := w.ns
	err := netlink.LinkSubscribeWithOptions(ch, w.done, netlink.LinkSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: func(error) {},
	})
	if err != nil {
		return fmt.Errorf("netdev: link subscription: %w", err)
	}
	pump(w, ctx, ch, func(u netlink.LinkUpdate) {
		if a := u.Attrs(); a != nil && a.Index == w.ifindex {
			up := a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown
			fn(a.MTU, up && a.Flags&net.FlagUp != 0)
		}
	})
	return nil
}

// watchNeigh calls fn for every valid neighbour entry the kernel reports
// on the interface (new or changed MAC), until ctx ends.
func (w *host) watchNeigh(ctx context.Context, fn func(ip netip.Addr, mac [6]byte)) error {
	ch := make(chan netlink.NeighUpdate, 64)
	ns := w.ns
	err := netlink.NeighSubscribeWithOptions(ch, w.done, netlink.NeighSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: func(error) {},
	})
	if err != nil {
		return fmt.Errorf("netdev: neighbour subscription: %w", err)
	}
	pump(w, ctx, ch, func(u netlink.NeighUpdate) {
		if u.Type != unix.RTM_NEWNEIGH || u.LinkIndex != w.ifindex ||
			u.State&nudValid == 0 || len(u.HardwareAddr) != 6 {
			return
		}
		ip, ok := netip.AddrFromSlice(u.IP)
		if !ok {
			return
		}
		fn(ip.Unmap(), [6]byte(u.HardwareAddr))
	})
	return nil
}

// pump calls handle for every update on ch, in a goroutine the watch waits
// for on Close, until ch closes, ctx ends or the watch is closed.
func pump[T any](w *host, ctx context.Context, ch <-chan T, handle func(T)) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			select {
			case u, ok := <-ch:
				if !ok {
					return
				}
				handle(u)
			case <-ctx.Done():
				return
			case <-w.done:
				return
			}
		}
	}()
}

const nudValid = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE |
	netlink.NUD_PERMANENT | netlink.NUD_NOARP

// resolveRounds is how many rounds of the kernel's probes (3 ARP or ND
// solicitations 1 s apart by default) a resolution runs before it fails: a
// caller would retry a resolution that failed once, as ping does at its next
// packet, and a host that answered none of them in two rounds is down.
const resolveRounds = 2

// Resolve returns the MAC of the next hop towards dst, asking the kernel to
// resolve it (ARP or ND) if it has no entry, and waiting until ctx ends
// (roce.Host). The next hop (dst itself, or its gateway) is returned too.
func (w *host) Resolve(ctx context.Context, dst netip.Addr) ([6]byte, netip.Addr, error) {
	var zero [6]byte
	dst = dst.Unmap()
	nh := dst
	if routes, err := w.h.RouteGet(net.IP(dst.AsSlice())); err == nil && len(routes) > 0 {
		r := routes[0]
		if r.LinkIndex != 0 && r.LinkIndex != w.ifindex {
			name := fmt.Sprint(r.LinkIndex)
			if l, err := w.h.LinkByIndex(r.LinkIndex); err == nil {
				name = l.Attrs().Name
			}
			return zero, nh, fmt.Errorf("%w: %v: the route leaves through %s, not %s", roce.ErrNoNeighbour, dst, name, w.ifname)
		}
		if gw, ok := netip.AddrFromSlice(r.Gw); ok && r.Gw != nil && !gw.IsUnspecified() {
			nh = gw.Unmap()
		}
	} else if err != nil {
		return zero, nh, fmt.Errorf("%w: %v: no route: %v", roce.ErrNoNeighbour, dst, err)
	}
	fam := netlink.FAMILY_V4
	if nh.Is6() {
		fam = netlink.FAMILY_V6
	}
	var triggered time.Time
	delay := time.Millisecond
	rounds := 0
	for {
		list, err := w.h.NeighList(w.ifindex, fam)
		if err != nil {
			return zero, nh, fmt.Errorf("%w: %v: %v", roce.ErrNoNeighbour, dst, err)
		}
		failed, found := false, false
		for _, n := range list {
			a, ok := netip.AddrFromSlice(n.IP)
			if !ok || a.Unmap() != nh {
				continue
			}
			found = true
			if n.State&nudValid != 0 && len(n.HardwareAddr) == 6 {
				var mac [6]byte
				copy(mac[:], n.HardwareAddr)
				return mac, nh, nil
			}
			if n.State&netlink.NUD_FAILED != 0 {
				failed = true
			}
		}
		if failed && !triggered.IsZero() && time.Since(triggered) > 50*time.Millisecond {
			if rounds >= resolveRounds {
				return zero, nh, fmt.Errorf("%w: %v: the kernel's resolution failed %d times (no answer to ARP/ND via %s)", roce.ErrNoNeighbour, nh, rounds, w.ifname)
			}
			triggered = time.Time{} // one more round of the kernel's probes
		}
		// Ask once, and again only if the entry vanished (garbage
		// collected) or failed, rather than interrupting the kernel's own
		// probes.
		if triggered.IsZero() || (!found && time.Since(triggered) > time.Second) {
			w.trigger(nh, fam)
			triggered = time.Now()
			rounds++
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return zero, nh, fmt.Errorf("%w: %v via %s: %w", roce.ErrNoNeighbour, nh, w.ifname, ctx.Err())
		case <-w.done:
			t.Stop()
			return zero, nh, roce.ErrClosed
		case <-t.C:
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// trigger makes the kernel start resolving nh: an RTM_NEWNEIGH with NTF_USE
// (neigh_event_send), or, if that is refused, a one-byte datagram to the
// discard port, which needs the neighbour too.
func (w *host) trigger(nh netip.Addr, fam int) {
	err := w.h.NeighSet(&netlink.Neigh{
		LinkIndex: w.ifindex,
		Family:    fam,
		State:     netlink.NUD_INCOMPLETE,
		Flags:     netlink.NTF_USE,
		IP:        net.IP(nh.AsSlice()),
	})
	if err == nil {
		return
	}
	var sa unix.Sockaddr
	fd := w.sock4
	if nh.Is4() {
		sa = &unix.SockaddrInet4{Port: 9, Addr: nh.As4()}
	} else {
		fd = w.sock6
		s6 := &unix.SockaddrInet6{Port: 9, Addr: nh.As16()}
		if nh.IsLinkLocalUnicast() {
			s6.ZoneId = uint32(w.ifindex)
		}
		sa = s6
	}
	if fd >= 0 {
		_ = unix.Sendto(fd, []byte{0}, unix.MSG_DONTWAIT, sa)
	}
}
