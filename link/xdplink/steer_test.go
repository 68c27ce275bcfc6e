package xdplink_test

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/goroce/goroce/link/xdplink"
)

// TestSteering checks the split between the AF_XDP socket and the kernel:
// UDP to 4791 sent by A's kernel arrives at B's link, while UDP to another
// port (and the ARP exchange before it) still reaches B's kernel.
func TestSteering(t *testing.T) {
	a, b := pair(t, 1500, xdplink.Options{})
	var other *net.UDPConn
	if err := b.ns.Do(func() (err error) {
		other, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: 9999})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var snd *net.UDPConn
	if err := a.ns.Do(func() (err error) {
		snd, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 99, 0, 1)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer snd.Close()

	// Kernel path: the reply-less datagram needs ARP first, which the
	// program passes to the kernel as well.
	if _, err := snd.WriteToUDP([]byte("to the kernel"), &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: 9999}); err != nil {
		t.Fatal(err)
	}
	other.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, _, err := other.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "to the kernel" {
		t.Fatalf("kernel socket on B: %q, %v", buf[:n], err)
	}

	// RoCEv2 port: the link gets the whole frame.
	payload := []byte("to the AF_XDP socket")
	if _, err := snd.WriteToUDP(payload, &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: 4791}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	found := false
	for !found {
		if _, err := b.l.ReadBatch(ctx, func(frames [][]byte) {
			for _, f := range frames {
				if isOurs(f) && bytes.Equal(f[42:], payload) && bytes.Equal(f[6:12], a.mac) {
					found = true
				}
			}
		}); err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
	}
	st, err := b.l.SteeringStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Redirected == 0 || st.Passed == 0 {
		t.Fatalf("steering counters %+v: want both redirected and passed frames", st)
	}
	t.Logf("steering on B: %+v", st)
}
