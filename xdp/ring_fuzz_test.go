package xdp

import (
	"encoding/binary"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeRings builds a Socket whose rings live in ordinary memory, so that a
// test can play the kernel's side.
func fakeRings(nframes, ringSize uint32) *Socket {
	const fs = 2048
	s := &Socket{
		fd:        -1,
		mem:       make([]byte, nframes*fs),
		frameSize: fs,
		chunkMask: ^uint64(fs - 1),
		rxCap:     fs - unix.XDP_PACKET_HEADROOM,
		txCap:     fs,
		nfr:       nframes,
		sg:        true,
	}
	off := unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 192}
	mk := func(entries uint32, size uint64) []byte { return make([]byte, 192+uint64(entries)*size) }
	fillSize := nextPow2(nframes / 2)
	s.fill.init(mk(fillSize, 8), off, fillSize)
	s.comp.init(mk(fillSize, 8), off, fillSize)
	s.rx.init(mk(ringSize, 16), off, ringSize)
	s.tx.init(mk(ringSize, 16), off, ringSize)
	s.txFree = newTxPool(uint64(nframes/2)*fs, fs, int(nframes-nframes/2))
	return s
}

// FuzzReceive fills the RX ring with arbitrary descriptors, as a faulty
// kernel might, and drains it with Receive, Frame, CopyFrame and Release:
// nothing may panic, Receive returns whole frames only, and the fill ring
// never takes more than it has room for.
func FuzzReceive(f *testing.F) {
	desc := func(addr uint64, l, opt uint32) []byte {
		b := make([]byte, 16)
		binary.LittleEndian.PutUint64(b, addr)
		binary.LittleEndian.PutUint32(b[8:], l)
		binary.LittleEndian.PutUint32(b[12:], opt)
		return b
	}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(byte(4), cat(desc(256, 60, 0), desc(2048+256, 1514, 0)))
	f.Add(byte(2), cat(desc(256, 1792, 1), desc(2048+256, 1792, 1), desc(4096+256, 10, 0), desc(6144+256, 64, 0)))
	f.Add(byte(8), cat(desc(256, 1792, 1), desc(2048+256, 100, 1)))
	f.Add(byte(1), cat(desc(1<<40, 5000, 7), desc(0, 0, 0)))
	f.Fuzz(func(t *testing.T, k byte, raw []byte) {
		const ringSize = 32
		s := fakeRings(64, ringSize)
		n := uint32(min(len(raw)/16, ringSize))
		for i := uint32(0); i < n; i++ {
			b := raw[16*i:]
			s.rx.descs[i] = unix.XDPDesc{
				Addr:    binary.LittleEndian.Uint64(b),
				Len:     binary.LittleEndian.Uint32(b[8:]),
				Options: binary.LittleEndian.Uint32(b[12:]),
			}
		}
		atomic.StoreUint32(s.rx.producer, n)
		descs := make([]Desc, int(k%20)+1)
		buf := make([]byte, 1<<16)
		for rounds := 0; rounds < 100; rounds++ {
			// The kernel takes everything offered on the fill ring.
			atomic.StoreUint32(s.fill.consumer, atomic.LoadUint32(s.fill.producer))
			got := s.Receive(descs)
			if got == 0 {
				break
			}
			if got > len(descs) || descs[got-1].More() {
				t.Fatalf("Receive = %d with last More %v", got, descs[got-1].More())
			}
			for i := 0; i < got; {
				if !descs[i].More() {
					_ = s.Frame(descs[i])
					i++
					continue
				}
				_, used, _ := s.CopyFrame(buf, descs[i:got])
				i += max(used, 1)
			}
			s.Release(descs[:got])
			if s.fill.cachedProd-atomic.LoadUint32(s.fill.consumer) > s.fill.size {
				t.Fatal("fill ring overfilled")
			}
		}
		if c := atomic.LoadUint32(s.rx.consumer); c > n {
			t.Fatalf("consumed %d of %d descriptors", c, n)
		}
	})
}

// FuzzCompletion fills the completion ring with arbitrary addresses, as a
// faulty kernel might, while spans are out: the pool never counts more
// chunks than it has, never hands out a chunk outside the TX half of the
// UMEM, and never hands out a chunk that is already out.
func FuzzCompletion(f *testing.F) {
	f.Add(uint8(3), []byte{0, 0x80, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(1), []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0x90, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, k uint8, raw []byte) {
		const nframes, fs = 64, 2048
		s := fakeRings(nframes, 32)
		out := map[uint64]bool{}
		take := func() {
			span := s.AllocTxSpan(int(k%3) + 1)
			if span == nil {
				return
			}
			a, ok := s.memAddr(span)
			if !ok || a < nframes/2*fs || a+uint64(len(span)) > nframes*fs {
				t.Fatalf("span at %#x+%d outside the TX chunks", a, len(span))
			}
			for c := a; c < a+uint64(len(span)); c += fs {
				if out[c] {
					t.Fatalf("chunk %#x handed out twice", c)
				}
				out[c] = true
			}
		}
		for i := 0; i < 8; i++ {
			take()
		}
		n := uint32(min(len(raw)/8, int(s.comp.size)))
		for i := uint32(0); i < n; i++ {
			a := binary.LittleEndian.Uint64(raw[8*i:])
			s.comp.addrs[i] = a
			delete(out, a&^(fs-1)) // a real completion gives the chunk back
		}
		atomic.StoreUint32(s.comp.producer, n)
		if free := s.TxFree(); free > nframes/2 {
			t.Fatalf("%d TX chunks free of %d", free, nframes/2)
		}
		for i := 0; i < 40; i++ {
			take()
		}
	})
}
