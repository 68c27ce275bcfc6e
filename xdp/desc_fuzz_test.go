package xdp

import (
	"encoding/binary"
	"testing"
)

// FuzzFrame feeds arbitrary descriptors, as a misbehaving kernel or caller
// could, to Frame and CopyFrame: they must stay inside the UMEM and inside
// one chunk, and never panic.
func FuzzFrame(f *testing.F) {
	seed := func(ds ...Desc) []byte {
		b := make([]byte, 16*len(ds))
		for i, d := range ds {
			binary.LittleEndian.PutUint64(b[16*i:], d.Addr)
			binary.LittleEndian.PutUint32(b[16*i+8:], d.Len)
			binary.LittleEndian.PutUint32(b[16*i+12:], d.Options)
		}
		return b
	}
	f.Add(seed(Desc{Addr: 256, Len: 1514}))
	f.Add(seed(Desc{Addr: 256, Len: 1792, Options: 1}, Desc{Addr: 2048 + 256, Len: 1000}))
	f.Add(seed(Desc{Addr: 8191, Len: 2}))
	f.Add(seed(Desc{Addr: 1<<64 - 1, Len: 1<<32 - 1, Options: 1}))
	f.Add(seed(Desc{Addr: 2048, Len: 0, Options: 1}, Desc{Addr: 4096, Len: 2048, Options: 1}))
	s := &Socket{mem: make([]byte, 4*2048), frameSize: 2048, chunkMask: ^uint64(2047)}
	dst := make([]byte, 3000)
	f.Fuzz(func(t *testing.T, b []byte) {
		ds := make([]Desc, 0, len(b)/16)
		for ; len(b) >= 16; b = b[16:] {
			ds = append(ds, Desc{
				Addr:    binary.LittleEndian.Uint64(b),
				Len:     binary.LittleEndian.Uint32(b[8:]),
				Options: binary.LittleEndian.Uint32(b[12:]),
			})
		}
		for _, d := range ds {
			fr := s.Frame(d)
			if fr == nil {
				continue
			}
			if len(fr) != int(d.Len) || d.Addr/2048 != (d.Addr+uint64(d.Len)-1)/2048 && d.Len > 0 {
				t.Fatalf("Frame(%+v) = %d bytes across chunks", d, len(fr))
			}
		}
		n, used, err := s.CopyFrame(dst, ds)
		if n > len(dst) || used > len(ds) || (err == nil && used == 0 && len(ds) > 0) {
			t.Fatalf("CopyFrame = %d, %d, %v", n, used, err)
		}
	})
}
