// Package netnstest creates throwaway network namespaces and veth pairs for
// tests, using rtnetlink (vishvananda/netlink) rather than the ip(8) tool.
//
// Everything a test creates is removed by t.Cleanup, also when the test fails.
// Namespaces are anonymous by default: they live only as long as this process
// holds a handle to them (or a process runs inside), so a test binary killed
// by SIGKILL leaks nothing. NewNamed additionally registers the namespace under
// /run/netns so that ip-netns(8) and shell tools can enter it; that mount is
// removed by cleanup but survives a SIGKILL of the test process.
//
// Code runs inside a namespace with NS.Do, which switches the calling
// goroutine's locked OS thread into the namespace and back. Subprocesses are
// started with NS.Start, which forks from such a thread: the child inherits
// the network namespace but, unlike "ip netns exec", keeps the parent's mount
// namespace, so /sys/class/net in the child still shows the original
// namespace (/proc/self/net is correct).
//
// The root network namespace is never modified.
//
// A fresh pair has no neighbour entries, and Linux queues only about 212 KB
// for a neighbour being resolved (IPv6 resolution on a new veth takes about a
// second), so a test whose first exchange is a burst calls Pair.Resolve (or
// Resolve) first.
//
// Typical use, two hosts on a wire at MTU 9000:
//
//	func TestX(t *testing.T) {
//		p := netnstest.NewPair(t, 9000) // skips unless root with netns support
//		var conn *net.UDPConn
//		err := p.B.Do(func() (err error) {
//			conn, err = net.ListenUDP("udp", &net.UDPAddr{Port: 4791})
//			return err
//		})
//		...
//		if err := p.A.Ping(p.VethB.Addr.Addr(), time.Second); err != nil {
//			t.Fatal(err)
//		}
//	}
package netnstest
