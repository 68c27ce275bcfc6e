package fpga

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// idleServer returns a server of depth slots of 256 bytes with every
// receive posted and no receive goroutine: the test feeds completions to
// complete itself.
func idleServer(t testing.TB, depth int) *Server {
	t.Helper()
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	t.Cleanup(func() { lb.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	peer := netip.MustParseAddr("10.0.0.2")
	dev, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Logger: quiet,
		Neighbours: map[netip.Addr]net.HardwareAddr{peer: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	s, err := NewServer(dev, 1, -1, 256, depth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.SetLogger(quiet)
	if err := s.SetFPGAGID(ib.GIDFromAddr(peer)); err != nil {
		t.Fatal(err)
	}
	if err := s.slab.postAll(); err != nil {
		t.Fatal(err)
	}
	s.pend = make([]int32, 0, repostBatch)
	return s
}

// checkSlots verifies that every slot is in exactly one place: posted, held
// by a reference, or queued for the next batch repost.
func checkSlots(t testing.TB, s *Server) {
	t.Helper()
	queued := make([]int, s.depth)
	for _, i := range s.pend {
		queued[i]++
	}
	held := 0
	for i := range s.depth {
		refs := uint32(s.refs[i].Load())
		if refs > 0 {
			held++
		}
		n := queued[i]
		if s.slab.posted[i].Load() {
			n++
		}
		if refs > 0 {
			n++
		}
		if n != 1 {
			t.Fatalf("slot %d: posted %v, %d references, queued %d times", i, s.slab.posted[i].Load(), refs, queued[i])
		}
	}
	if st := s.Stats(); st.Held != held {
		t.Fatalf("stats %+v: %d slots held", st, held)
	}
}

// goodWC is a gen-2 frame of n bytes in slot.
func goodWC(slot uint64, n uint32) roce.WorkCompletion {
	return roce.WorkCompletion{WRID: slot, Opcode: roce.WCRecv, Flags: roce.WCWithImm, ByteLen: n, Imm: 0x101}
}

// A slot completed twice before it is posted again is delivered once and
// posted once: the second completion is counted (BadDuplicate) and ignored,
// and the frame a consumer still holds keeps its slot.
func TestDuplicateCompletion(t *testing.T) {
	s := idleServer(t, 4)
	var kept []Frame
	s.Attach(ConsumerFunc(func(f Frame) {
		f.Retain()
		kept = append(kept, f)
	}))
	wc := goodWC(2, 10)
	s.complete(&wc, DataPathAny)
	s.complete(&wc, DataPathAny) // the slot is held: a duplicate
	s.flushReposts()
	checkSlots(t, s)
	if st := s.Stats(); st.Frames != 1 || st.BadDuplicate != 1 || st.Held != 1 || len(kept) != 1 {
		t.Fatalf("stats %+v, %d frames delivered", s.Stats(), len(kept))
	}
	kept[0].Release()
	checkSlots(t, s)
	// A bad completion repeated in one batch, more often than the slab has
	// slots: the slot is queued for its repost once.
	bad := roce.WorkCompletion{WRID: 3, Opcode: 0xa7}
	for range 3*repostBatch + 1 {
		s.complete(&bad, DataPathAny)
	}
	checkSlots(t, s)
	s.flushReposts()
	checkSlots(t, s)
	if st := s.Stats(); st.BadOpcode != 1 || st.BadDuplicate != 3*repostBatch+1 || st.Held != 0 || st.BadRelease != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Once posted again the slot takes its next completion.
	s.complete(&wc, DataPathAny)
	if st := s.Stats(); st.Frames != 2 || len(kept) != 2 {
		t.Fatalf("after the repost: stats %+v", st)
	}
}

// Releasing a frame more often than it was retained, or giving the slab a
// slot it has posted already, is counted (BadRelease) and ignored: the slot
// is posted once, and a batch of repeated slots stays within the slab.
func TestDoubleRelease(t *testing.T) {
	s := idleServer(t, 4)
	var kept Frame
	s.Attach(ConsumerFunc(func(f Frame) {
		f.Retain()
		kept = f
	}))
	wc := goodWC(1, 20)
	s.complete(&wc, DataPathAny)
	s.flushReposts()
	kept.Release()
	kept.Release()
	kept.Retain()
	checkSlots(t, s)
	if st := s.Stats(); st.BadRelease != 2 || st.Held != 0 {
		t.Fatalf("stats %+v", st)
	}
	if err := s.slab.repost(1); err != nil {
		t.Fatal(err)
	}
	s.slab.repost(-1)
	s.slab.repost(4)
	slots := make([]int32, 4*repostBatch)
	for i := range slots {
		slots[i] = int32(i % 6) // every slot posted already, and two out of range
	}
	if err := s.slab.repostBatch(slots); err != nil {
		t.Fatal(err)
	}
	checkSlots(t, s)
	if st := s.Stats(); st.BadRelease != 2+3+uint64(len(slots)) {
		t.Fatalf("stats %+v", st)
	}
}
