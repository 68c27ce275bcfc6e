package fpga

import (
	"testing"

	"github.com/goroce/goroce/roce"
)

// FuzzComplete feeds arbitrary completions to the server's completion
// handler: whatever a device reports, the server counts and reposts, and
// never panics or hands out a frame outside its slab. Each completion comes
// in a batch of repeats longer than the slab, as a device that reports one
// slot again and again would: it is delivered or reposted once, the rest are
// counted as duplicates, and every slot ends up posted once.
func FuzzComplete(f *testing.F) {
	f.Add(uint64(0), uint8(0), uint8(128), uint32(100), uint32(0x101), uint8(2))
	f.Add(uint64(7), uint8(5), uint8(129), uint32(0), uint32(0), uint8(0))
	f.Add(uint64(1<<40), uint8(0), uint8(128), uint32(1<<31), uint32(0), uint8(2))
	s := idleServer(f, 8)
	var held Frame
	s.Attach(ConsumerFunc(func(fr Frame) {
		if d := fr.Data(); len(d) != fr.Len() || len(d) == 0 || len(d) > 256 {
			panic("frame outside its slot")
		}
		held.Release() // a stale frame: counted, not honoured
		held = fr
	}))
	f.Fuzz(func(t *testing.T, wrid uint64, status, opcode uint8, n, imm uint32, flags uint8) {
		wc := roce.WorkCompletion{WRID: wrid, Status: roce.WCStatus(status), Opcode: roce.WCOpcode(opcode),
			ByteLen: n, Imm: imm, Flags: roce.WCFlags(flags)}
		if wc.Status == roce.WCWRFlushErr {
			return // stops the server: covered by the tests
		}
		dup := s.Stats().BadDuplicate
		for range 2*repostBatch + 1 {
			s.complete(&wc, DataPath(flags%3))
		}
		checkSlots(t, s)
		s.flushReposts()
		checkSlots(t, s)
		st := s.Stats()
		if want := uint64(2 * repostBatch); wrid < 8 && st.BadDuplicate-dup != want {
			t.Fatalf("%d duplicates counted, want %d: %+v", st.BadDuplicate-dup, want, st)
		}
		if st.Held != 0 {
			t.Fatalf("stats %+v: slots held with no consumer keeping a frame", st)
		}
	})
}

// FuzzCompleteSequence runs sequences of completions, retains, releases
// (double ones included) and batch ends against a small slab: every slot is
// always in exactly one place (posted, held or queued), and at the end of
// each sequence, all frames released, every slot is posted again.
func FuzzCompleteSequence(f *testing.F) {
	f.Add([]byte{0, 1, 0, 1, 3, 0, 2, 0, 2, 0, 0, 1, 3, 0})
	f.Add([]byte{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2})
	f.Add([]byte{0, 0x80, 0, 0x81, 0, 0x82, 0, 0x83, 0, 0x80, 3, 0, 2, 0, 2, 0, 2, 1, 4, 5})
	const depth = 4
	s := idleServer(f, depth)
	var kept []Frame
	var keep bool
	s.Attach(ConsumerFunc(func(fr Frame) {
		if d := fr.Data(); len(d) != fr.Len() || len(d) == 0 || len(d) > 256 {
			panic("frame outside its slot")
		}
		if keep {
			fr.Retain()
			kept = append(kept, fr)
		}
	}))
	f.Fuzz(func(t *testing.T, ops []byte) {
		kept = kept[:0]
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			slot := uint64(arg&0x7f) % (depth + 2) // two slots out of range
			keep = arg&0x80 != 0
			switch op % 6 {
			case 0: // a frame
				wc := goodWC(slot, 1+uint32(arg))
				s.complete(&wc, DataPathAny)
			case 1: // an error completion
				wc := roce.WorkCompletion{WRID: slot, Status: roce.WCLocLenErr}
				s.complete(&wc, DataPathAny)
			case 2: // a release, perhaps of a frame released already
				if len(kept) > 0 {
					kept[int(arg)%len(kept)].Release()
				}
			case 3: // the end of a completion batch
				s.flushReposts()
			case 4: // another reference, perhaps to a frame released already
				if len(kept) > 0 {
					fr := kept[int(arg)%len(kept)]
					fr.Retain()
					kept = append(kept, fr)
				}
			case 5: // a slot given back again, or one the slab has not
				if slot >= depth || s.slab.posted[slot].Load() {
					s.slab.repost(int(slot))
				}
			}
			checkSlots(t, s)
		}
		s.flushReposts()
		for _, fr := range kept {
			fr.Release()
		}
		// Retained twice and released once: release until the count is 0.
		for _, fr := range kept {
			for uint32(s.refs[fr.slot].Load()) > 0 && uint32(s.refs[fr.slot].Load()>>32) == fr.gen {
				fr.Release()
			}
		}
		checkSlots(t, s)
		for i := range depth {
			if !s.slab.posted[i].Load() {
				t.Fatalf("slot %d not posted at the end: %+v", i, s.Stats())
			}
		}
	})
}
