package memlink_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/memlink"
)

func testFrame(t *testing.T, v6 bool, tos uint8, size int) []byte {
	t.Helper()
	h := link.Header{SrcAddr: netip.MustParseAddr("10.0.0.1"), DstAddr: netip.MustParseAddr("10.0.0.2"),
		SrcPort: 1, DstPort: 4791, TOS: tos, TTL: 64}
	if v6 {
		h.SrcAddr, h.DstAddr = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	}
	b := make([]byte, size)
	h.Put(b, size-h.HeaderSize())
	return b
}

func TestSwitchMarksByQueue(t *testing.T) {
	// 1000-byte frames into a port that sends one per 8.192 µs at 1 Gb/s:
	// the k-th frame offered at time 0 finds (k-1) kB queued.
	cfg := memlink.SwitchConfig{Rate: 1e9, Buffer: 20000, Kmin: 5000, Kmax: 10000, Pmax: 0.5, Seed: 1}
	cases := []struct {
		name   string
		tos    uint8
		v6     bool
		marked func(q int) (lo, hi bool) // may and must be marked at queue q
	}{
		{"ECT(0) IPv4", 2, false, nil},
		{"ECT(1) IPv6", 1, true, nil},
		{"Not-ECT is never marked", 0, false, func(int) (bool, bool) { return false, false }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := memlink.NewSwitch(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var got []bool
			accepted := 0
			for range 25 {
				if s.Enqueue(0, testFrame(t, c.v6, c.tos, 1000)) {
					accepted++
				}
			}
			if accepted != 20 {
				t.Fatalf("accepted %d frames into 20 kB, want 20", accepted)
			}
			var last time.Duration
			for now := time.Duration(0); now < time.Millisecond; now += time.Microsecond {
				s.Dequeue(now, func(b []byte) {
					fr, err := link.ParseFrame(b)
					if err != nil {
						t.Fatal(err)
					}
					if fr.Version == 4 && link.IPv4Checksum(b[fr.IPOffset:fr.IPOffset+link.IPv4Size]) != 0 {
						t.Fatal("IPv4 checksum broken by the mark")
					}
					got = append(got, fr.TOS&3 == 3)
					if fr.TOS&3 != 3 && fr.TOS&3 != c.tos {
						t.Fatalf("ECN %d, sent %d", fr.TOS&3, c.tos)
					}
					last = now
				})
			}
			for k, m := range got {
				q := k * 1000
				may, must := q > cfg.Kmin, q >= cfg.Kmax
				if c.marked != nil {
					may, must = c.marked(q)
				}
				if m && !may || !m && must {
					t.Errorf("frame %d (queue %d B): marked %v", k, q, m)
				}
			}
			// 20 frames of 1024 bytes on the wire at 1 Gb/s: 163.84 µs.
			if last < 163*time.Microsecond || last > 165*time.Microsecond {
				t.Fatalf("last frame left at %v", last)
			}
			st := s.Stats()
			if st.Dropped != 5 || st.Departed != 20 || st.QueueMax != 20000 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestSwitchDeterministic(t *testing.T) {
	run := func() []bool {
		s, err := memlink.NewSwitch(memlink.SwitchConfig{Rate: 1e9, Buffer: 1 << 20, Kmin: 0, Kmax: 1 << 20, Pmax: 0.5, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		var marks []bool
		for i := range 200 {
			s.Enqueue(time.Duration(i)*time.Microsecond, testFrame(t, false, 2, 1000))
		}
		s.Dequeue(time.Second, func(b []byte) { marks = append(marks, b[link.EthernetSize+1]&3 == 3) })
		return marks
	}
	a, b := run(), run()
	n := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("runs differ at frame %d", i)
		}
		if a[i] {
			n++
		}
	}
	if n == 0 || n == len(a) {
		t.Fatalf("%d of %d marked: the draw decided nothing", n, len(a))
	}
}

func TestSwitchConfigRejected(t *testing.T) {
	for _, c := range []memlink.SwitchConfig{
		{Rate: 0, Buffer: 1},
		{Rate: 1, Buffer: 0},
		{Rate: 1, Buffer: 1, Kmin: 5, Kmax: 4},
		{Rate: 1, Buffer: 1, Pmax: 2},
	} {
		if _, err := memlink.NewSwitch(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
