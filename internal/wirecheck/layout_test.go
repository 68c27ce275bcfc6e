package wirecheck

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcapdump"
)

// The tests in this file compare rocectl with testdata/roce_layout.py, a
// second, table-driven header decoder written from the IBA/rxe layout tables.
// It is the only independent check of the headers Wireshark 4.0 cannot
// dissect (see tsharkCoverage): RD's RDETH/DETH, XRC's XRCETH, FLUSH's FETH,
// ATOMIC_WRITE and CNP.

func layoutScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "roce_layout.py"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// layoutView is what roce_layout.py decodes of a record.
type layoutView struct {
	Opcode     uint8
	Pad        uint8
	DestQP     uint32
	PSN        uint32
	RDETH      *pcapdump.RDETH
	DETH       *pcapdump.DETH
	XRCETH     *pcapdump.XRCETH
	FETH       *pcapdump.FETH
	RETH       *pcapdump.RETH
	Atomic     *pcapdump.Atomic
	AETH       *pcapdump.AETH
	AtomicAck  *pcapdump.AtomicAck
	Imm        *uint32
	IETH       *uint32
	PayloadLen int
}

func viewOf(r *pcapdump.Record) string {
	b, err := json.Marshal(layoutView{r.Opcode, r.Pad, r.DestQP, r.PSN, r.RDETH, r.DETH, r.XRCETH, r.FETH,
		r.RETH, r.Atomic, r.AETH, r.AtomicAck, r.Imm, r.IETH, r.PayloadLen})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// crossCheckLayout compares rocectl and roce_layout.py on every RoCEv2 frame
// of file and returns how many frames of each opcode it compared.
func crossCheckLayout(t *testing.T, file string, lay []pcapdump.Record) map[ib.Opcode]int {
	t.Helper()
	recs := rocectlJSON(t, file)
	seen := map[ib.Opcode]int{}
	byFrame := map[int]*pcapdump.Record{}
	for i := range lay {
		byFrame[lay[i].Frame] = &lay[i]
	}
	for i := range recs {
		r := &recs[i]
		l, ok := byFrame[r.Frame]
		switch {
		case r.NotRoCE:
			if ok {
				t.Errorf("%s frame %d: rocectl says %q, roce_layout.py decoded it", relName(t, file), r.Frame, r.Error)
			}
			continue
		case !ok:
			t.Errorf("%s frame %d: roce_layout.py skipped a frame rocectl decoded", relName(t, file), r.Frame)
			continue
		case l.Error != "" || r.Error != "":
			t.Errorf("%s frame %d: rocectl error %q, roce_layout.py error %q", relName(t, file), r.Frame, r.Error, l.Error)
			continue
		}
		if got, want := viewOf(r), viewOf(l); got != want {
			t.Errorf("%s frame %d (%v):\nrocectl        %s\nroce_layout.py %s", relName(t, file), r.Frame, ib.Opcode(r.Opcode), got, want)
		}
		seen[ib.Opcode(r.Opcode)]++
	}
	return seen
}

func TestLayoutOpcodeTable(t *testing.T) {
	py := needScapy(t)
	ops, err := LayoutOpcodes(toolCtx(t), py, layoutScript(t))
	if err != nil {
		t.Fatal(err)
	}
	var defined []int
	for o := 0; o < 256; o++ {
		if ib.Opcode(o).Info().Valid {
			defined = append(defined, o)
		}
	}
	if !slices.Equal(ops, defined) {
		t.Errorf("defined opcodes differ:\nib             %v\nroce_layout.py %v", defined, ops)
	}
}

func TestLayoutGenerated(t *testing.T) {
	py := needScapy(t)
	path, cases := generatedPCAP(t)
	res, err := Layout(toolCtx(t), py, layoutScript(t), path)
	if err != nil {
		t.Fatal(err)
	}
	seen := crossCheckLayout(t, path, res[path])
	for _, c := range cases {
		if seen[c.Spec.BTH.Opcode] == 0 {
			t.Errorf("%v: no frame compared", c.Spec.BTH.Opcode)
		}
	}
	// The comparison is only as good as the script's coverage: every
	// extension header must have been decoded by it somewhere.
	keys := map[string]bool{}
	for _, l := range res[path] {
		b, _ := json.Marshal(&l)
		var m map[string]any
		json.Unmarshal(b, &m)
		for k := range m {
			keys[k] = true
		}
	}
	for _, k := range []string{"rdeth", "deth", "xrceth", "feth", "reth", "atomic", "aeth", "atomic_ack", "imm", "ieth"} {
		if !keys[k] {
			t.Errorf("roce_layout.py never decoded %s", k)
		}
	}
	t.Logf("%d frames of %d opcodes compared", len(res[path]), len(seen))
}

func TestLayoutCaptures(t *testing.T) {
	py := needScapy(t)
	files := captures(t)
	res, err := Layout(toolCtx(t), py, layoutScript(t), files...)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		for _, c := range crossCheckLayout(t, f, res[f]) {
			n += c
		}
	}
	if n == 0 {
		t.Error("no RoCEv2 frame compared")
	}
	t.Logf("%d RoCEv2 frames in %d captures compared", n, len(files))
}
