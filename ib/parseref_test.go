package ib

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"testing"
)

// parseIBRef is parseIB as it was before it visited only the headers an
// opcode has: every header in wire order, each checked against the end.
func (p *Packet) parseIBRef(b []byte, base int, tbl *[256]OpcodeInfo) bool {
	*p = Packet{err: p.err}
	if len(b) < BTHSize {
		return p.fail("bth", base, ErrTruncated, "shorter than BTH")
	}
	bth := BTH(b[:BTHSize:BTHSize])
	if bth.TVer() != 0 {
		return p.fail("bth", base+bthFlags, ErrUnsupported, "transport header version is not 0")
	}
	info := &tbl[bth.Opcode()]
	if !info.Valid {
		return p.fail("bth", base+bthOpcode, ErrUnsupported, "undefined opcode")
	}
	for i, h := range headerOrder {
		if info.Headers&h == 0 {
			continue
		}
		o := int(info.offsets[i])
		e := o + h.Size()
		if e > len(b) {
			return p.fail(h.Layer(), base+o, ErrTruncated, "no room for header the opcode requires")
		}
		p.setHeader(h, b[o:e:e])
	}
	hl := info.HeaderLen
	if len(b)-hl < ICRCSize {
		return p.fail("icrc", base+hl, ErrTruncated, "no room for ICRC")
	}
	rest := len(b) - hl - ICRCSize
	pad := int(bth.PadCount())
	if !info.Payload && rest != 0 {
		return p.fail("payload", base+hl, ErrMalformed, "data after headers of an opcode without payload")
	}
	if pad > rest {
		return p.fail("bth", base+bthFlags, ErrMalformed, "pad count beyond payload")
	}
	dataEnd := hl + rest - pad
	icrc := len(b) - ICRCSize
	p.BTH = bth
	p.Payload = b[hl:dataEnd:dataEnd]
	p.Pad = b[dataEnd:icrc:icrc]
	p.ICRC = b[icrc:len(b):len(b)]
	p.IB = b
	p.Info = *info
	return true
}

// checkParseIBRef decodes b with both table profiles, by parseIB and by
// the reference, into packets that held another decode before: the
// results must be identical.
func checkParseIBRef(t *testing.T, b, prev []byte) {
	t.Helper()
	for _, tbl := range []*[256]OpcodeInfo{&opcodeTable, &dcProfileTable} {
		var got, want Packet
		if prev != nil {
			got.parse(prev, tbl)
			want.parse(prev, tbl)
		}
		got.Reset()
		okGot := got.parseIB(b, 3, tbl)
		okWant := want.parseIBRef(b, 3, tbl)
		if okGot != okWant || !reflect.DeepEqual(got, want) {
			t.Fatalf("% x: parseIB %v %+v\nreference %v %+v", b, okGot, got, okWant, want)
		}
	}
}

// TestHeaderLenEndsHeaders: the fast path of parseIB relies on HeaderLen
// being the end of the last header, so that headers that fit in the
// packet fit one and all.
func TestHeaderLenEndsHeaders(t *testing.T) {
	for _, tbl := range []*[256]OpcodeInfo{&opcodeTable, &dcProfileTable} {
		for op, info := range tbl {
			if !info.Valid {
				continue
			}
			end := BTHSize
			for i, h := range headerOrder {
				if info.Headers&h != 0 {
					end = max(end, int(info.offsets[i])+h.Size())
				}
			}
			if end != info.HeaderLen {
				t.Errorf("opcode %#x: headers end at %d, HeaderLen %d", op, end, info.HeaderLen)
			}
		}
	}
}

func TestParseIBMatchesReference(t *testing.T) {
	for _, s := range seedFrames(t) {
		var p Packet
		if Parse(s, &p) != nil && ParseDC(s, &p) != nil {
			continue
		}
		ibp := bytes.Clone(p.IB)
		for n := 0; n <= len(ibp); n++ {
			checkParseIBRef(t, ibp[:n], s)
		}
	}
}

func FuzzParseIBReference(f *testing.F) {
	for _, s := range seedFrames(f) {
		var p Packet
		if Parse(s, &p) == nil || ParseDC(s, &p) == nil {
			f.Add(bytes.Clone(p.IB), s)
		}
	}
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, b, prev []byte) {
		checkParseIBRef(t, b, prev)
	})
}

// plainICRC is the ICRC by its definition: CRC-32 over eight 0xFF bytes,
// the IP header (cut to its fixed size), UDP header and IB packet with the
// variant fields set to ones, computed over one buffer by the standard
// library. TestICRCMatchesPlain and FuzzICRC check ICRC against it.
func plainICRC(ip, rest []byte) uint32 {
	h := bytes.Clone(ip)
	if len(h) > 0 && h[0]>>4 == 6 {
		h = h[:min(len(h), IPv6Size)]
		h[0] |= 0x0f
		for _, i := range []int{1, 2, 3, 7} {
			if i < len(h) {
				h[i] = 0xff
			}
		}
	} else {
		h = h[:min(len(h), IPv4Size)]
		for _, i := range []int{1, 8, 10, 11} {
			if i < len(h) {
				h[i] = 0xff
			}
		}
	}
	r := bytes.Clone(rest)
	for _, i := range []int{6, 7, 12} {
		if i < len(r) {
			r[i] = 0xff
		}
	}
	all := append(bytes.Repeat([]byte{0xff}, 8), h...)
	return crc32.ChecksumIEEE(append(all, r...))
}

// TestICRCMatchesPlain: the word-at-a-time masked headers and the byte
// path give the CRC of the definition, for both IP versions, every split
// of the UDP header from the IB packet and every length around the
// headers' 20 bytes.
func TestICRCMatchesPlain(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 200)
	for i := 0; i < 3000; i++ {
		for j := range buf {
			buf[j] = byte(r.Uint32())
		}
		iplen := []int{0, 1, 19, 20, 21, 39, 40, 41}[r.IntN(8)]
		ip := buf[:iplen]
		if r.IntN(2) == 0 && iplen > 0 {
			ip[0] = 0x60 | ip[0]&0x0f
		} else if iplen > 0 {
			ip[0] = 0x45
		}
		rest := buf[100 : 100+r.IntN(100)]
		want := plainICRC(ip, rest)
		if got := ICRC(ip, rest); got != want {
			t.Fatalf("ICRC(% x, % x) = %#x, want %#x", ip, rest, got, want)
		}
		k := r.IntN(len(rest) + 1)
		if got := ICRCSplit(ip, rest[:k], rest[k:]); got != want {
			t.Fatalf("ICRCSplit at %d of % x, % x = %#x, want %#x", k, ip, rest, got, want)
		}
	}
}
