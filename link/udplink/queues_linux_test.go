package udplink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
)

func listenQueuesT(t *testing.T, addr netip.AddrPort, queues int) *Link {
	t.Helper()
	l, err := ListenOptions(addr, Options{EphemeralPort: true, Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// btHeader is a datagram that starts like a BTH to qpn, tagged with seq.
func btHeader(qpn uint32, seq uint32) []byte {
	b := make([]byte, 16)
	b[0] = 0x04 // RC SEND only; the link does not look
	binary.BigEndian.PutUint32(b[4:], qpn&0xFFFFFF)
	binary.BigEndian.PutUint32(b[12:], seq)
	return b
}

// drainQueues reads every queue of l until want datagrams arrived, and
// returns, per queue, the payloads it got.
func drainQueues(t *testing.T, l *Link, want int) [][][]byte {
	t.Helper()
	qs := l.RxQueues()
	got := make([][][]byte, len(qs))
	n := 0
	deadline := time.Now().Add(10 * time.Second)
	for n < want && time.Now().Before(deadline) {
		for i, q := range qs {
			k, err := q.(link.Poller).PollBatch(func(frames [][]byte) {
				for _, f := range frames {
					pf, err := link.ParseFrame(f)
					if err != nil {
						t.Errorf("queue %d: %v", i, err)
						continue
					}
					got[i] = append(got[i], bytes.Clone(f[pf.Payload:pf.End]))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
		if n < want {
			time.Sleep(time.Millisecond)
		}
	}
	if n != want {
		t.Fatalf("received %d datagrams, want %d", n, want)
	}
	return got
}

// Every datagram lands on queue QPN mod Queues, whatever socket sent it,
// and in the order sent.
func TestQueuesSteerByQPN(t *testing.T) {
	const queues = 4
	l := listenQueuesT(t, netip.MustParseAddrPort("127.0.0.1:0"), queues)
	if s := l.Stats(); s.Queues != queues || !s.Steered || s.GRO {
		t.Fatalf("Stats: %d queues, steered %v, GRO %v; want %d, true, false", s.Queues, s.Steered, s.GRO, queues)
	}
	dst := net.UDPAddrFromAddrPort(l.LocalAddr())
	var senders []*net.UDPConn
	for range 3 {
		c, err := net.DialUDP("udp4", nil, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		senders = append(senders, c)
	}
	const per = 40
	for i := range per {
		for qpn := uint32(17); qpn < 17+queues*2; qpn++ {
			// QPs on every queue, each from several source ports.
			c := senders[(i+int(qpn))%len(senders)]
			if _, err := c.Write(btHeader(qpn, uint32(i))); err != nil {
				t.Fatal(err)
			}
		}
		if i%8 == 7 {
			time.Sleep(time.Millisecond) // stay within the socket buffers
		}
	}
	got := drainQueues(t, l, per*queues*2)
	for i, n := range l.Stats().QueueBuffers {
		if n != per*2 {
			t.Errorf("queue %d read %d buffers, want %d", i, n, per*2)
		}
	}
	for q, ds := range got {
		next := map[uint32]uint32{}
		for _, d := range ds {
			qpn := binary.BigEndian.Uint32(d[4:]) & 0xFFFFFF
			if int(qpn%queues) != q {
				t.Fatalf("QPN %d arrived on queue %d, want %d", qpn, q, qpn%queues)
			}
			seq := binary.BigEndian.Uint32(d[12:])
			if seq != next[qpn] {
				t.Fatalf("QPN %d: datagram %d arrived after %d", qpn, seq, next[qpn])
			}
			next[qpn]++
		}
		if len(ds) != per*2 {
			t.Errorf("queue %d got %d datagrams, want %d", q, len(ds), per*2)
		}
	}
}

// A datagram too short for a BTH goes to queue 0.
func TestQueuesRuntToFirst(t *testing.T) {
	l := listenQueuesT(t, netip.MustParseAddrPort("127.0.0.1:0"), 3)
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(l.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	got := drainQueues(t, l, 1)
	if len(got[0]) != 1 {
		t.Fatalf("runt arrived on another queue: %v", got)
	}
}

// A second link on the address of a link with several queues fails as it
// does on a link of one socket, and so does one with several queues on
// the address of either: SO_REUSEPORT must not let a second program share
// the traffic.
func TestQueuesAddressInUse(t *testing.T) {
	for _, tc := range []struct{ first, second int }{{4, 1}, {4, 4}, {1, 4}} {
		l := listenQueuesT(t, netip.MustParseAddrPort("127.0.0.1:0"), tc.first)
		l2, err := ListenOptions(l.LocalAddr(), Options{Queues: tc.second})
		if err == nil {
			l2.Close()
			t.Fatalf("%d queues, then %d: the second link opened on %v", tc.first, tc.second, l.LocalAddr())
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("%d queues, then %d: %v, want EADDRINUSE", tc.first, tc.second, err)
		}
		l.Close()
	}
}

func TestQueuesLimits(t *testing.T) {
	for _, q := range []int{-1, MaxQueues + 1} {
		if l, err := ListenOptions(netip.MustParseAddrPort("127.0.0.1:0"), Options{EphemeralPort: true, Queues: q}); err == nil {
			l.Close()
			t.Errorf("Queues %d accepted", q)
		}
	}
	l := listenQueuesT(t, netip.MustParseAddrPort("127.0.0.1:0"), MaxQueues)
	if n := len(l.RxQueues()); n != MaxQueues {
		t.Fatalf("%d queues, want %d", n, MaxQueues)
	}
}

// Close closes every queue: a reader blocked on any of them returns
// ErrClosed.
func TestQueuesClose(t *testing.T) {
	l, err := ListenOptions(netip.MustParseAddrPort("127.0.0.1:0"), Options{EphemeralPort: true, Queues: 3})
	if err != nil {
		t.Fatal(err)
	}
	qs := l.RxQueues()
	errs := make(chan error, len(qs))
	for _, q := range qs {
		go func() {
			_, err := q.ReadBatch(t.Context(), func([][]byte) {})
			errs <- err
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for range qs {
		select {
		case err := <-errs:
			if !errors.Is(err, link.ErrClosed) {
				t.Errorf("ReadBatch after Close: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a queue's reader did not return after Close")
		}
	}
	// The port is free again.
	l2 := listenQueuesT(t, l.LocalAddr(), 2)
	l2.Close()
}

// A link's sends to a link of several queues on the same host, with GSO:
// the frames of two QPs taking turns in bursts of equal size arrive each
// on its QP's queue, in order. A GSO run reaches a local receiver whole
// and is steered by its first datagram, so a run that joined two QPs
// would put one QP's datagrams on the other's queue, behind or ahead of
// its own.
func TestQueuesSteerGSORuns(t *testing.T) {
	const queues = 2
	r := listenQueuesT(t, netip.MustParseAddrPort("127.0.0.1:0"), queues)
	s := listenOpts(t, "127.0.0.1", Options{})
	requireOffloads(t, s)
	var frames [][]byte
	const bursts, burst = 20, 6 // 60 datagrams a queue: within an unprivileged socket buffer
	for i := range bursts * burst {
		qpn := uint32(17 + i/burst%queues)
		p := payload(i, 1024)
		binary.BigEndian.PutUint32(p[4:], qpn)
		binary.BigEndian.PutUint32(p[12:], uint32(i))
		frames = append(frames, mkframe(s.LocalAddr(), r.LocalAddr(), 0, p))
	}
	for len(frames) > 0 {
		n, err := s.WriteBatch(frames[:min(len(frames), 48)])
		if err != nil {
			t.Fatal(err)
		}
		frames = frames[n:]
		time.Sleep(time.Millisecond)
	}
	if st := s.Stats(); st.GSOSends == 0 {
		t.Fatalf("no GSO run sent: %+v", st)
	}
	got := drainQueues(t, r, bursts*burst)
	for q, ds := range got {
		last := map[uint32]int64{}
		for _, d := range ds {
			qpn := binary.BigEndian.Uint32(d[4:]) & 0xFFFFFF
			if int(qpn%queues) != q {
				t.Fatalf("QPN %d arrived on queue %d", qpn, q)
			}
			seq := int64(binary.BigEndian.Uint32(d[12:]))
			if l, ok := last[qpn]; ok && seq <= l {
				t.Fatalf("QPN %d: datagram %d after %d", qpn, seq, l)
			}
			last[qpn] = seq
		}
	}
}
