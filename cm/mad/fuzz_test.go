package mad

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/goroce/goroce/internal/pcaptest"
)

func addSeeds(f *testing.F) {
	f.Add(unhex(f, vectorMAD))
	f.Add(make([]byte, Size))
	f.Add([]byte{1, 7, 2, 3})
	// The captured MADs, when the lab captures are present.
	d := filepath.Join(pcaptest.RepoRoot(f), "..", "shared", "rxe-lab", "captures", "mtu4096")
	if _, err := os.Stat(d); err == nil {
		for _, name := range []string{"cm_rping.pcap", "cm_udaddy_sidr.pcap"} {
			b, err := os.ReadFile(filepath.Join(d, name))
			if err != nil {
				continue
			}
			// Every 322-byte IPv4 CM frame holds its MAD at byte 62.
			for i := 0; i+62+Size <= len(b); i++ {
				if b[i] == 1 && b[i+1] == 7 && b[i+2] == 2 && b[i+3] == 3 {
					f.Add(b[i : i+Size])
				}
			}
		}
	}
	for a := AttrREQ; a <= AttrAPR; a++ {
		m := make(MAD, Size)
		h := CMHeader(a, 1)
		m.Encode(&h)
		for i := HeaderSize; i < Size; i++ {
			m[i] = byte(i * 37)
		}
		f.Add([]byte(m))
	}
}

// fieldsOf decodes the message of m.
func fieldsOf(m MAD) any {
	switch m.AttrID() {
	case AttrREQ:
		return m.REQ().Fields()
	case AttrMRA:
		return m.MRA().Fields()
	case AttrREJ:
		return m.REJ().Fields()
	case AttrREP:
		return m.REP().Fields()
	case AttrRTU:
		return m.RTU().Fields()
	case AttrDREQ:
		return m.DREQ().Fields()
	case AttrDREP:
		return m.DREP().Fields()
	case AttrSIDRREQ:
		return m.SIDRREQ().Fields()
	case AttrSIDRREP:
		return m.SIDRREP().Fields()
	case AttrLAP:
		return m.LAP().Fields()
	case AttrAPR:
		return m.APR().Fields()
	}
	return nil
}

// FuzzParseCM checks that any input either fails with a *ParseError or
// decodes to fields that survive Encode → Fields unchanged, and that
// re-encoding is idempotent on the bytes.
func FuzzParseCM(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseCM(b)
		if err != nil {
			if _, ok := err.(*ParseError); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			_, _ = ParseMAD(b)
			return
		}
		f1 := fieldsOf(m)
		once := reencode(t, m)
		f2 := fieldsOf(MAD(once))
		if !reflect.DeepEqual(f1, f2) {
			t.Fatalf("fields changed by re-encoding:\n%+v\n%+v", f1, f2)
		}
		if twice := reencode(t, MAD(once)); string(twice) != string(once) {
			t.Fatal("re-encoding not idempotent")
		}
		if m.AttrID() == AttrREJ {
			_ = RejectErrorFrom(m.REJ()).Error()
		}
		// Views over any prefix must not panic in Fields.
		for _, n := range []int{0, 1, 50, 100, DataSize - 1} {
			_ = REQ(m.Data()[:n]).Fields()
			_ = LAP(m.Data()[:n]).Fields()
		}
	})
}

// FuzzCMAHeader checks the rdma_cm header decoder.
func FuzzCMAHeader(f *testing.F) {
	f.Add(unhex(f, vectorMAD)[HeaderSize+140:])
	f.Add(make([]byte, CMAHeaderSize))
	f.Add([]byte{0, 0x60})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseCMAHeader(b)
		if err != nil {
			if _, ok := err.(*ParseError); !ok {
				t.Fatalf("error %T", err)
			}
			_ = CMAHeader(b).Fields()
			return
		}
		fl := h.Fields()
		out := make([]byte, CMAHeaderSize)
		CMAHeader(out).Encode(&fl)
		if got := CMAHeader(out).Fields(); got != fl {
			t.Fatalf("round trip %+v -> %+v", fl, got)
		}
	})
}

// FuzzSplitServiceID checks ServiceID/SplitServiceID agree.
func FuzzSplitServiceID(f *testing.F) {
	f.Add(uint64(0x1064E21))
	f.Fuzz(func(t *testing.T, sid uint64) {
		if ps, port, ok := SplitServiceID(sid); ok && ServiceID(ps, port) != sid {
			t.Fatalf("%#x -> %v %d", sid, ps, port)
		}
	})
}
