package cuobj

import (
	"bytes"
	"errors"
	"testing"
)

func TestHello(t *testing.T) {
	b := appendHello(nil, ProtoRC, 0xabcdef)
	if len(b) != helloLen {
		t.Fatalf("%d bytes", len(b))
	}
	p, ep, err := parseHello(append(b, make([]byte, 44)...))
	if err != nil || p != ProtoRC || ep != 0xabcdef {
		t.Fatalf("parse = %v %#x %v", p, ep, err)
	}
	for _, bad := range [][]byte{nil, b[:11], append([]byte("CUOBX"), b[5:]...),
		append(append([]byte{}, b[:5]...), append([]byte{2}, b[6:]...)...),
		append(append([]byte{}, b...), 1), appendHello(nil, ProtoRC, 0), appendHello(nil, ProtoRC, 1<<24)} {
		if _, _, err := parseHello(bad); !errors.Is(err, errHello) {
			t.Errorf("parseHello(%x) = %v", bad, err)
		}
	}
}

func FuzzParseHello(f *testing.F) {
	f.Add(appendHello(nil, ProtoRC, 7))
	f.Add([]byte("CUOBJ"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, ep, err := parseHello(b)
		if err != nil {
			if !errors.Is(err, errHello) {
				t.Fatal(err)
			}
			return
		}
		if back := appendHello(nil, p, ep); !bytes.Equal(back, b[:helloLen]) {
			t.Fatalf("%x parses but prints as %x", b, back)
		}
	})
}
