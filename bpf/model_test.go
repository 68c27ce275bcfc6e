//go:build linux

package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// model is the program's decision written in Go, from the description in
// doc.go; the kernel's verdicts are checked against it. A nil local means
// the address filter is off.
func model(b []byte, port uint16, local map[netip.Addr]bool) verdict {
	be := binary.BigEndian
	if len(b) < 14 {
		return pass
	}
	et, off := be.Uint16(b[12:]), 14
	var dst netip.Addr
	for range 2 {
		if et != 0x8100 && et != 0x88a8 {
			break
		}
		if len(b) < off+4 {
			return pass
		}
		et, off = be.Uint16(b[off+2:]), off+4
	}
	switch et {
	case 0x0800:
		if len(b) < off+20 || b[off]>>4 != 4 || b[off]&0xf < 5 || b[off+9] != 17 || be.Uint16(b[off+6:])&0x3fff != 0 {
			return pass
		}
		dst = netip.AddrFrom4([4]byte(b[off+16 : off+20]))
		off += int(b[off]&0xf) * 4
	case 0x86dd:
		if len(b) < off+40 || b[off]>>4 != 6 || b[off+6] != 17 {
			return pass
		}
		dst = netip.AddrFrom16([16]byte(b[off+24 : off+40])).Unmap()
		off += 40
	default:
		return pass
	}
	if len(b) < off+8 || be.Uint16(b[off+2:]) != port {
		return pass
	}
	if local != nil && !local[dst] {
		return otherAddr
	}
	return steer
}

func TestModelAgreesWithCases(t *testing.T) {
	for _, tc := range frameCases() {
		if got := model(tc.f.bytes(), DefaultPort, nil); got != tc.want {
			t.Errorf("%s: model says %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMutations flips bytes of valid frames and compares the kernel with
// the model.
func TestMutations(t *testing.T) {
	p := requireBPF(t, Options{})
	seed := uint32(7)
	rnd := func() uint32 { seed = seed*1664525 + 1013904223; return seed >> 8 }
	cases := frameCases()
	for i := range 3000 {
		data := cases[int(rnd())%len(cases)].f.bytes()
		for range 1 + rnd()%3 {
			data[int(rnd())%len(data)] ^= byte(1 << (rnd() % 8))
		}
		if rnd()%4 == 0 {
			data = data[:14+int(rnd())%(len(data)-13)]
		}
		want := model(data, DefaultPort, nil)
		t.Run("", func(t *testing.T) {
			if i%500 == 0 {
				t.Logf("mutation %d: % x", i, data)
			}
			checkVerdict(t, p, data, want)
		})
	}
}

// FuzzProgram runs the loaded program on arbitrary frames under
// BPF_PROG_TEST_RUN and compares its verdict with the model.
func FuzzProgram(f *testing.F) {
	for _, tc := range frameCases() {
		f.Add(tc.f.bytes())
	}
	f.Add(make([]byte, 14))
	p := requireBPF(f, Options{})
	filtered := requireBPF(f, Options{})
	setFilter(f, filtered)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 14 || len(data) > 3000 {
			return // test runs need an Ethernet header and fit one page
		}
		checkVerdict(t, p, data, model(data, DefaultPort, nil))
		checkVerdict(t, filtered, data, model(data, DefaultPort, filterAddrs))
	})
}
