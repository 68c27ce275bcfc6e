//go:build linux

package netnstest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

// Ping sends ICMP (or ICMPv6) echo requests from inside n to dst until one
// is answered or timeout passes. It needs CAP_NET_RAW.
func (n *NS) Ping(dst netip.Addr, timeout time.Duration) error {
	network, reqType, replyType := "ip4:icmp", byte(8), byte(0)
	if dst.Is6() && !dst.Is4In6() {
		network, reqType, replyType = "ip6:ipv6-icmp", 128, 129
	}
	dst = dst.Unmap()
	var conn net.PacketConn
	if err := n.Do(func() (err error) {
		conn, err = net.ListenPacket(network, "")
		return err
	}); err != nil {
		return fmt.Errorf("netnstest: ping %v: %w", dst, err)
	}
	defer conn.Close()
	id := uint16(os.Getpid())
	to := &net.IPAddr{IP: dst.AsSlice(), Zone: dst.Zone()}
	buf := make([]byte, 1500)
	deadline := time.Now().Add(timeout)
	for seq := uint16(1); time.Now().Before(deadline); seq++ {
		req := []byte{reqType, 0, 0, 0, 0, 0, 0, 0, 'g', 'o', 'r', 'o', 'c', 'e'}
		binary.BigEndian.PutUint16(req[4:], id)
		binary.BigEndian.PutUint16(req[6:], seq)
		if reqType == 8 {
			// The kernel fills in the ICMPv6 checksum, not the ICMPv4 one.
			binary.BigEndian.PutUint16(req[2:], inetChecksum(req))
		}
		if _, err := conn.WriteTo(req, to); err != nil {
			return fmt.Errorf("netnstest: ping %v: %w", dst, err)
		}
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			m, from, err := conn.ReadFrom(buf)
			if err != nil {
				break
			}
			fa, _ := from.(*net.IPAddr)
			if m >= len(req) && buf[0] == replyType && binary.BigEndian.Uint16(buf[4:]) == id &&
				bytes.Equal(buf[8:m], req[8:]) && fa != nil && fa.IP.Equal(to.IP) {
				return nil
			}
		}
	}
	return fmt.Errorf("netnstest: no echo reply from %v within %v", dst, timeout)
}

func inetChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
