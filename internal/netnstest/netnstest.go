//go:build linux

package netnstest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Cap is a Linux capability number (unix.CAP_*).
type Cap int

var capNames = map[Cap]string{
	unix.CAP_NET_ADMIN: "CAP_NET_ADMIN",
	unix.CAP_NET_RAW:   "CAP_NET_RAW",
	unix.CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
	unix.CAP_BPF:       "CAP_BPF",
	unix.CAP_PERFMON:   "CAP_PERFMON",
	unix.CAP_IPC_LOCK:  "CAP_IPC_LOCK",
}

func (c Cap) String() string {
	if n, ok := capNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CAP_%d", int(c))
}

// HasCap reports whether the calling process has capability c in its
// effective set.
func HasCap(c Cap) (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	i, bit := int(c)/32, uint(c)%32
	if i >= len(data) {
		return false, nil
	}
	return data[i].Effective&(1<<bit) != 0, nil
}

// RequireCaps skips the test unless the process has every capability in
// caps, naming the ones that are missing.
func RequireCaps(t testing.TB, caps ...Cap) {
	t.Helper()
	var missing []string
	for _, c := range caps {
		ok, err := HasCap(c)
		if err != nil {
			t.Skipf("cannot read capabilities: %v", err)
		}
		if !ok {
			missing = append(missing, c.String())
		}
	}
	if len(missing) > 0 {
		t.Skipf("test needs %s (euid %d); run as root", strings.Join(missing, ", "), os.Geteuid())
	}
}

// RequireRoot skips the test unless it runs with the capabilities needed to
// create and enter network namespaces and configure links: CAP_SYS_ADMIN
// (unshare/setns) and CAP_NET_ADMIN (rtnetlink).
func RequireRoot(t testing.TB) {
	t.Helper()
	RequireCaps(t, unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN)
}

var netnsProbe struct {
	once sync.Once
	err  error
}

// SkipUnlessNetns skips the test unless the process may create network
// namespaces (capabilities present and the kernel built with CONFIG_NET_NS,
// not forbidden by a seccomp or user-namespace policy).
func SkipUnlessNetns(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	netnsProbe.once.Do(func() {
		h, err := newAnonymous()
		if err != nil {
			netnsProbe.err = err
			return
		}
		h.Close()
	})
	if netnsProbe.err != nil {
		t.Skipf("network namespaces unavailable (CONFIG_NET_NS / unshare(CLONE_NEWNET)): %v", netnsProbe.err)
	}
}

// NS is a network namespace owned by a test.
type NS struct {
	name   string // registered under /run/netns; empty if anonymous
	handle netns.NsHandle
	nl     *netlink.Handle
}

// New creates an anonymous network namespace with its loopback up. It is
// removed when the test ends.
func New(t testing.TB) *NS {
	t.Helper()
	SkipUnlessNetns(t)
	h, err := newAnonymous()
	if err != nil {
		t.Fatalf("netnstest: create namespace: %v", err)
	}
	return setup(t, h, "")
}

var seq atomic.Uint32

// NewNamed creates a network namespace registered as /run/netns/<name> (so
// "ip netns exec <name>" works); name is generated when empty. Cleanup
// unregisters it.
func NewNamed(t testing.TB, name string) *NS {
	t.Helper()
	SkipUnlessNetns(t)
	if name == "" {
		name = fmt.Sprintf("goroce-test-%d-%d", os.Getpid(), seq.Add(1))
	}
	var h netns.NsHandle
	err := onThread(func() (err error) {
		h, err = netns.NewNamed(name)
		return err
	})
	if err != nil {
		t.Fatalf("netnstest: create namespace %q: %v", name, err)
	}
	return setup(t, h, name)
}

func setup(t testing.TB, h netns.NsHandle, name string) *NS {
	t.Helper()
	n := &NS{name: name, handle: h}
	// Registered before anything else can fail so that the namespace never
	// outlives the test.
	t.Cleanup(func() {
		if n.nl != nil {
			n.nl.Close()
		}
		n.handle.Close()
		if n.name != "" {
			if err := netns.DeleteNamed(n.name); err != nil {
				t.Errorf("netnstest: unregister namespace %q: %v", n.name, err)
			}
		}
	})
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netnstest: netlink handle in namespace: %v", err)
	}
	n.nl = nl
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatalf("netnstest: find lo: %v", err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		t.Fatalf("netnstest: set lo up: %v", err)
	}
	return n
}

// onThread runs fn on a locked OS thread and leaves the thread's network
// namespace as it found it. If it cannot be restored the thread stays locked
// to the goroutine, which makes the runtime discard it.
func onThread(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	restored := false
	defer func() {
		if err := netns.Set(orig); err == nil {
			restored = true
		}
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}

func newAnonymous() (netns.NsHandle, error) {
	var h netns.NsHandle
	err := onThread(func() (err error) {
		h, err = netns.New()
		return err
	})
	return h, err
}

// Name returns the /run/netns name, or "" for an anonymous namespace.
func (n *NS) Name() string { return n.name }

// Handle returns the namespace file descriptor (valid until cleanup).
func (n *NS) Handle() netns.NsHandle { return n.handle }

// Netlink returns a netlink handle bound to the namespace (valid until cleanup).
func (n *NS) Netlink() *netlink.Handle { return n.nl }

// Do runs fn on the calling goroutine, with its OS thread locked and switched
// into the namespace, and switches back afterwards. Sockets opened in fn
// belong to the namespace. Goroutines started by fn do not run in the
// namespace. fn may call t.Fatal: the namespace is restored on Goexit too.
func (n *NS) Do(fn func() error) error {
	return onThread(func() error {
		if err := netns.Set(n.handle); err != nil {
			return fmt.Errorf("netnstest: setns: %w", err)
		}
		return fn()
	})
}

// Start starts cmd inside the namespace: the child is forked from a thread
// that is in the namespace. Only the network namespace differs from the
// parent's.
func (n *NS) Start(cmd *exec.Cmd) error {
	return n.Do(cmd.Start)
}

// Run is Start followed by Wait.
func (n *NS) Run(cmd *exec.Cmd) error {
	if err := n.Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// VethConfig describes a veth pair between two namespaces.
type VethConfig struct {
	Name, PeerName           string           // default "veth0" / "veth1"
	MTU, PeerMTU             int              // default 1500; PeerMTU defaults to MTU
	Addr, PeerAddr           netip.Prefix     // optional (IPv4 or IPv6)
	HardwareAddr, PeerHWAddr net.HardwareAddr // optional; random when nil
	Queues                   int              // RX/TX queues on each end (default 1)
	Down                     bool             // leave both ends down
}

// Veth is one end of a created veth pair, as seen from its namespace.
type Veth struct {
	NS           *NS
	Name         string
	Index        int
	HardwareAddr net.HardwareAddr
	Addr         netip.Prefix
}

// NewVeth creates a veth pair with one end in a and the other in b (a and b
// may be the same namespace), configured per cfg. The pair is deleted by
// cleanup.
func NewVeth(t testing.TB, a, b *NS, cfg VethConfig) (end, peer *Veth) {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "veth0"
	}
	if cfg.PeerName == "" {
		cfg.PeerName = "veth1"
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.PeerMTU == 0 {
		cfg.PeerMTU = cfg.MTU
	}
	la := netlink.NewLinkAttrs()
	la.Name = cfg.Name
	la.MTU = cfg.MTU
	la.HardwareAddr = cfg.HardwareAddr
	if cfg.Queues > 0 {
		la.NumTxQueues, la.NumRxQueues = cfg.Queues, cfg.Queues
	}
	v := &netlink.Veth{
		LinkAttrs:        la,
		PeerName:         cfg.PeerName,
		PeerMTU:          uint32(cfg.PeerMTU),
		PeerHardwareAddr: cfg.PeerHWAddr,
		PeerNamespace:    netlink.NsFd(b.handle),
	}
	if err := a.nl.LinkAdd(v); err != nil {
		t.Fatalf("netnstest: add veth %s/%s (mtu %d/%d): %v", cfg.Name, cfg.PeerName, cfg.MTU, cfg.PeerMTU, err)
	}
	t.Cleanup(func() {
		// Deleting one end removes both. It is gone already if a test
		// deleted it or its namespace died.
		if l, err := a.nl.LinkByName(cfg.Name); err == nil {
			if err := a.nl.LinkDel(l); err != nil {
				t.Errorf("netnstest: delete veth %s: %v", cfg.Name, err)
			}
		}
	})
	end = configure(t, a, cfg.Name, cfg.Addr, !cfg.Down)
	peer = configure(t, b, cfg.PeerName, cfg.PeerAddr, !cfg.Down)
	if !cfg.Down {
		for _, v := range []*Veth{end, peer} {
			if err := v.WaitReady(5 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	return end, peer
}

// WaitReady waits until the link is operationally up (veth carrier follows
// the peer) and its configured address (with an IPv6 one, the link-local
// address too) is no longer tentative, so that the first packet a test sends
// is not lost to link or address setup.
func (v *Veth) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := v.NS.nl.LinkByIndex(v.Index)
		if err != nil {
			return fmt.Errorf("netnstest: find %s: %w", v.Name, err)
		}
		ready := l.Attrs().OperState == netlink.OperUp
		if ready {
			addrs, err := v.NS.nl.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return fmt.Errorf("netnstest: list addresses of %s: %w", v.Name, err)
			}
			for _, a := range addrs {
				// The configured address; and on an IPv6 link the automatic
				// link-local one too, which stays tentative for 1–2 s of DAD:
				// until it is usable the kernel answers no neighbour
				// solicitation on the link (the first ones went unanswered
				// for 2 s, and under load all three of a resolution).
				// IPv4 tests do not wait for it.
				ip, _ := netip.AddrFromSlice(a.IP)
				ip = ip.Unmap()
				own := ip == v.Addr.Addr() || (v.Addr.Addr().Is6() && ip.IsLinkLocalUnicast())
				if own && a.Flags&unix.IFA_F_TENTATIVE != 0 {
					ready = false
				}
			}
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netnstest: %s not ready after %v (operstate %v)", v.Name, timeout, l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func configure(t testing.TB, n *NS, name string, addr netip.Prefix, up bool) *Veth {
	t.Helper()
	l, err := n.nl.LinkByName(name)
	if err != nil {
		t.Fatalf("netnstest: find %s: %v", name, err)
	}
	if addr.IsValid() {
		a := &netlink.Addr{IPNet: &net.IPNet{
			IP:   addr.Addr().AsSlice(),
			Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen()),
		}}
		if addr.Addr().Is6() {
			// Usable at once instead of after duplicate address detection.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := n.nl.AddrAdd(l, a); err != nil {
			t.Fatalf("netnstest: add %v to %s: %v", addr, name, err)
		}
	}
	if up {
		if err := n.nl.LinkSetUp(l); err != nil {
			t.Fatalf("netnstest: set %s up: %v", name, err)
		}
	}
	return &Veth{NS: n, Name: name, Index: l.Attrs().Index, HardwareAddr: l.Attrs().HardwareAddr, Addr: addr}
}

// SetMTU changes the MTU of the veth end.
func (v *Veth) SetMTU(mtu int) error {
	l, err := v.NS.nl.LinkByIndex(v.Index)
	if err != nil {
		return fmt.Errorf("netnstest: find %s: %w", v.Name, err)
	}
	if err := v.NS.nl.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("netnstest: set %s mtu %d: %w", v.Name, mtu, err)
	}
	return nil
}

// Link returns the current netlink view of the veth end.
func (v *Veth) Link() (netlink.Link, error) {
	return v.NS.nl.LinkByIndex(v.Index)
}

// Pair is a ready-made topology: two fresh namespaces joined by one veth
// pair, A at 10.99.0.1/24 (veth0) and B at 10.99.0.2/24 (veth1), both with
// the given MTU (0: 1500).
type Pair struct {
	A, B         *NS
	VethA, VethB *Veth
}

// NewPair creates a Pair.
func NewPair(t testing.TB, mtu int) *Pair {
	t.Helper()
	return NewPairConfig(t, VethConfig{
		MTU:      mtu,
		Addr:     netip.MustParsePrefix("10.99.0.1/24"),
		PeerAddr: netip.MustParsePrefix("10.99.0.2/24"),
	})
}

// NewPairConfig creates a Pair with an explicit veth configuration.
func NewPairConfig(t testing.TB, cfg VethConfig) *Pair {
	t.Helper()
	a, b := New(t), New(t)
	va, vb := NewVeth(t, a, b, cfg)
	return &Pair{A: a, B: b, VethA: va, VethB: vb}
}

// NamedPath returns the path of a registered namespace, or an error for an
// anonymous one.
func (n *NS) NamedPath() (string, error) {
	if n.name == "" {
		return "", errors.New("netnstest: anonymous namespace has no path under /run/netns")
	}
	return filepath.Join("/run/netns", n.name), nil
}

// NewVLAN creates a VLAN interface named "<parent>.<id>" on a veth end, in
// the same namespace, with TPID 0x8100 (or 0x88a8 if qinq), the given
// address, and up. It goes away with its parent. The test is skipped if the
// kernel has no 802.1Q support.
func NewVLAN(t testing.TB, parent *Veth, id int, qinq bool, addr netip.Prefix) *Veth {
	t.Helper()
	n := parent.NS
	la := netlink.NewLinkAttrs()
	la.Name = fmt.Sprintf("%s.%d", parent.Name, id)
	la.ParentIndex = parent.Index
	proto := netlink.VLAN_PROTOCOL_8021Q
	if qinq {
		proto = netlink.VLAN_PROTOCOL_8021AD
	}
	if err := n.nl.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: id, VlanProtocol: proto}); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("netnstest: kernel cannot create VLAN interfaces (CONFIG_VLAN_8021Q not set): %v", err)
		}
		t.Fatalf("netnstest: add vlan %s: %v", la.Name, err)
	}
	t.Cleanup(func() {
		if l, err := n.nl.LinkByName(la.Name); err == nil {
			n.nl.LinkDel(l)
		}
	})
	v := configure(t, n, la.Name, addr, true)
	if err := v.WaitReady(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	return v
}
