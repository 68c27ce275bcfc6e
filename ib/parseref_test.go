package ib

import (
	"bytes"
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
