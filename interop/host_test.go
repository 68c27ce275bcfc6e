// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package interop

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/rxelab"
)

// hostPort is the host side's link on rxeh0: an AF_PACKET socket that sends
// whole Ethernet frames and sees every frame the guests send to rxeh0, plus
// UDP sockets bound to 4791 so the peer netns kernel does not answer RoCE
// packets with ICMP port unreachable. The frames' IP addresses are the
// kernel's own addresses of rxeh0, so it also answers the guests' ARP and
// neighbour solicitations and carries the TCP out-of-band exchange.
type hostPort struct {
	fd    int
	sinks []net.PacketConn
}

func openHostPort(t *testing.T, lab *rxelab.Lab) *hostPort {
	t.Helper()
	h := &hostPort{fd: -1}
	err := lab.InPeerNS(func() error {
		ifi, err := net.InterfaceByName(lab.PeerIf)
		if err != nil {
			return err
		}
		proto := htons(unix.ETH_P_ALL)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		h.fd = fd
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
			return fmt.Errorf("bind to %s: %w", lab.PeerIf, err)
		}
		// Our own transmissions would otherwise come back on this socket.
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			return fmt.Errorf("PACKET_IGNORE_OUTGOING: %w", err)
		}
		for _, a := range []netip.Addr{lab.PeerAddr, lab.PeerAddr6} {
			if !a.IsValid() {
				continue
			}
			c, err := net.ListenPacket("udp", netip.AddrPortFrom(a, ib.RoCEv2Port).String())
			if err != nil {
				return fmt.Errorf("UDP sink on %v: %w", a, err)
			}
			h.sinks = append(h.sinks, c)
		}
		return nil
	})
	t.Cleanup(h.close)
	if err != nil {
		t.Fatalf("host port in %s: %v", lab.PeerNS, err)
	}
	return h
}

func (h *hostPort) close() {
	if h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
	for _, c := range h.sinks {
		c.Close()
	}
	h.sinks = nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// send transmits one Ethernet frame on rxeh0.
func (h *hostPort) send(frame []byte) error {
	n, err := unix.Write(h.fd, frame)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if n != len(frame) {
		return fmt.Errorf("send: %d of %d bytes", n, len(frame))
	}
	return nil
}

// recv returns the next received frame for which accept reports true,
// copied into buf; other frames (ARP, neighbour discovery, ...) are skipped.
func (h *hostPort) recv(ctx context.Context, buf []byte, accept func([]byte) bool) ([]byte, error) {
	fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLIN}}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := unix.Poll(fds, 100)
		if errors.Is(err, unix.EINTR) || n == 0 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("poll: %w", err)
		}
		n, _, err = unix.Recvfrom(h.fd, buf, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("recv: %w", err)
		}
		if n > len(buf) {
			return nil, fmt.Errorf("recv: %d-byte frame truncated to %d", n, len(buf))
		}
		if accept(buf[:n]) {
			return buf[:n], nil
		}
	}
}

// pingpongDest is what ibv_{rc,uc,ud}_pingpong exchange over TCP port
// 18515 before any RoCE packet flows: one line "LID:QPN:PSN:GID" each way,
// in hex (%04x:%06x:%06x: and the 16 GID bytes as 32 hex digits), sent as a
// 52-byte C string with its NUL; the client finally sends "done\0".
type pingpongDest struct {
	LID uint16
	QPN uint32
	PSN ib.PSN
	GID ib.GID
}

const pingpongMsgLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

func (d pingpongDest) wire() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN, uint32(d.PSN), hex.EncodeToString(d.GID[:]))
	return append([]byte(s), 0)
}

func parsePingpongDest(b []byte) (pingpongDest, error) {
	s := string(bytes.TrimRight(b, "\x00"))
	f := strings.Split(s, ":")
	if len(f) != 4 || len(f[0]) != 4 || len(f[1]) != 6 || len(f[2]) != 6 || len(f[3]) != 32 {
		return pingpongDest{}, fmt.Errorf("bad pingpong address %q", s)
	}
	lid, err1 := strconv.ParseUint(f[0], 16, 16)
	qpn, err2 := strconv.ParseUint(f[1], 16, 24)
	psn, err3 := strconv.ParseUint(f[2], 16, 24)
	gid, err4 := hex.DecodeString(f[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return pingpongDest{}, fmt.Errorf("bad pingpong address %q: %w", s, err)
	}
	return pingpongDest{LID: uint16(lid), QPN: uint32(qpn), PSN: ib.PSN(psn), GID: ib.GID(gid)}, nil
}

// pingpongClient plays the client side of the pingpong exchange with the
// server at addr, from the peer netns. The server is a guest program that
// may not listen yet, so the connection is retried until ctx ends or
// serverDone is closed (the server exited).
func pingpongClient(ctx context.Context, lab *rxelab.Lab, addr netip.Addr, local pingpongDest, serverDone <-chan struct{}) (pingpongDest, error) {
	var conn net.Conn
	for {
		err := lab.InPeerNS(func() error {
			var err error
			d := net.Dialer{Timeout: rxelab.DialTimeout}
			conn, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(addr, rxelab.OOBPort).String())
			return err
		})
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return pingpongDest{}, fmt.Errorf("connecting to the pingpong server: %w (last: %v)", ctx.Err(), err)
		case <-serverDone:
			return pingpongDest{}, fmt.Errorf("pingpong server exited before accepting (last dial: %v)", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// The C code reads each message with one read(2), so each must leave in
	// one write.
	if _, err := conn.Write(local.wire()); err != nil {
		return pingpongDest{}, fmt.Errorf("sending our address: %w", err)
	}
	msg := make([]byte, pingpongMsgLen)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return pingpongDest{}, fmt.Errorf("reading the server's address: %w", err)
	}
	remote, err := parsePingpongDest(msg)
	if err != nil {
		return pingpongDest{}, err
	}
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		return pingpongDest{}, fmt.Errorf("sending done: %w", err)
	}
	return remote, nil
}

// pingpongServer plays the server side: it accepts one client on the peer
// netns's OOB port, reads its address, answers with local (after ready ran:
// the server brings its QP up before answering) and waits for "done".
type pingpongServer struct {
	ln net.Listener
}

func listenPingpong(t *testing.T, lab *rxelab.Lab, addr netip.Addr) *pingpongServer {
	t.Helper()
	var ln net.Listener
	err := lab.InPeerNS(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, rxelab.OOBPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("listening for the pingpong client: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return &pingpongServer{ln: ln}
}

func (s *pingpongServer) exchange(ctx context.Context, local func(remote pingpongDest) (pingpongDest, error)) (pingpongDest, error) {
	type result struct {
		c   net.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() {
		c, err := s.ln.Accept()
		acc <- result{c, err}
	}()
	var conn net.Conn
	select {
	case <-ctx.Done():
		s.ln.Close()
		return pingpongDest{}, fmt.Errorf("waiting for the pingpong client: %w", ctx.Err())
	case r := <-acc:
		if r.err != nil {
			return pingpongDest{}, r.err
		}
		conn = r.c
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	msg := make([]byte, pingpongMsgLen)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return pingpongDest{}, fmt.Errorf("reading the client's address: %w", err)
	}
	remote, err := parsePingpongDest(msg)
	if err != nil {
		return pingpongDest{}, err
	}
	me, err := local(remote)
	if err != nil {
		return remote, err
	}
	if _, err := conn.Write(me.wire()); err != nil {
		return remote, fmt.Errorf("sending our address: %w", err)
	}
	done := make([]byte, 5)
	if _, err := io.ReadFull(conn, done); err != nil || string(done) != "done\x00" {
		return remote, fmt.Errorf("reading done: %q %v", done, err)
	}
	return remote, nil
}

func TestPingpongDestWire(t *testing.T) {
	// The first line of the captured ibv_ud_pingpong exchange.
	const captured = "0000:000012:cd7e44:00000000000000000000ffff0a4d0003\x00"
	d, err := parsePingpongDest([]byte(captured))
	if err != nil {
		t.Fatal(err)
	}
	want := pingpongDest{QPN: 0x12, PSN: 0xcd7e44, GID: ib.GIDFromAddr(netip.MustParseAddr("10.77.0.3"))}
	if d != want {
		t.Fatalf("parsed %+v, want %+v", d, want)
	}
	if got := string(d.wire()); got != captured || len(got) != pingpongMsgLen {
		t.Fatalf("wire() = %q, want %q", got, captured)
	}
	for _, bad := range []string{"", "0000:000012:cd7e44", "0000:00001g:cd7e44:00000000000000000000ffff0a4d0003",
		"0000:000012:cd7e44:00000000000000000000ffff0a4d00"} {
		if _, err := parsePingpongDest([]byte(bad)); err == nil {
			t.Errorf("parsePingpongDest(%q) accepted", bad)
		}
	}
}

// stopJob ends a guest program: it waits briefly for the program to end
// on its own (so its error output explains a failure), then cancels it.
func stopJob(job *rxelab.Job, cancel context.CancelFunc) (stdout, stderr []byte, code int) {
	select {
	case <-job.Done():
	case <-time.After(5 * time.Second):
		cancel()
	}
	stdout, stderr, code, _ = job.Wait()
	return stdout, stderr, code
}

// rxeCounters returns the guest's rxe0 port counters, for failure reports.
func rxeCounters(g *rxelab.Guest) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _, _, err := g.Exec(ctx, "sh", "-c", "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *")
	if err != nil {
		return err.Error()
	}
	return string(out)
}
