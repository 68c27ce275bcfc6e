package wirecheck

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcapdump"
)

// icrcInputs splits a RoCEv2 frame into what ib.ICRC takes: the IP header and
// UDP header through pad (without the ICRC). It is written here, not taken
// from ib.Parse, so that a framing bug in ib cannot hide itself.
func icrcInputs(frame []byte) (ipHdr, udpAndIB, icrc []byte, ok bool) {
	if len(frame) < 14 {
		return nil, nil, nil, false
	}
	et := binary.BigEndian.Uint16(frame[12:])
	off := 14
	for et == 0x8100 || et == 0x88a8 {
		if len(frame) < off+4 {
			return nil, nil, nil, false
		}
		et = binary.BigEndian.Uint16(frame[off+2:])
		off += 4
	}
	var ipLen int
	switch et {
	case 0x0800:
		ipLen = 20
	case 0x86dd:
		ipLen = 40
	default:
		return nil, nil, nil, false
	}
	if len(frame) < off+ipLen+8 {
		return nil, nil, nil, false
	}
	ipHdr = frame[off : off+ipLen]
	udp := frame[off+ipLen:]
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if binary.BigEndian.Uint16(udp[2:]) != ib.RoCEv2Port || ulen < 8+ib.BTHSize+ib.ICRCSize || ulen > len(udp) {
		return nil, nil, nil, false
	}
	return ipHdr, udp[:ulen-ib.ICRCSize], udp[ulen-ib.ICRCSize : ulen], true
}

func scapyScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "roce_icrc.py"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func needScapy(t *testing.T) string {
	t.Helper()
	py, err := PythonWithScapy(toolCtx(t))
	if err != nil {
		if errors.Is(err, ErrToolMissing) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	return py
}

// crossCheckScapy compares, frame by frame, ib.ICRC with scapy's ICRC (IPv4)
// and the script's masked pseudo-header CRC (IPv4 and IPv6), and rocectl's
// icrc/icrc_ok with both. It returns how many frames of each family it
// checked.
func crossCheckScapy(t *testing.T, file string, sfs []ScapyFrame) (v4, v6 int) {
	t.Helper()
	recs := rocectlJSON(t, file)
	if len(sfs) != len(recs) {
		t.Fatalf("%s: scapy reads %d frames, rocectl %d", relName(t, file), len(sfs), len(recs))
	}
	var frames [][]byte
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pcapdump.ReadFrames(f, func(fr pcapdump.Frame) error {
		frames = append(frames, bytes.Clone(fr.Data))
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	for i, sf := range sfs {
		name := relName(t, file)
		rec := &recs[i]
		ipHdr, udpAndIB, wire, ok := icrcInputs(frames[i])
		if !ok {
			if sf.Family != 0 {
				t.Errorf("%s frame %d: scapy script sees RoCEv2, the test's own split does not", name, sf.Frame)
			}
			continue
		}
		var got [4]byte
		binary.LittleEndian.PutUint32(got[:], ib.ICRC(ipHdr, udpAndIB))
		switch sf.Family {
		case 4:
			v4++
			if !bytes.Equal(sf.Scapy, got[:]) {
				t.Errorf("%s frame %d: ib.ICRC %x, scapy %x", name, sf.Frame, got, sf.Scapy)
			}
		case 6:
			v6++
		default:
			t.Errorf("%s frame %d: the scapy script does not see RoCEv2", name, sf.Frame)
			continue
		}
		if !bytes.Equal(sf.Masked, got[:]) {
			t.Errorf("%s frame %d (IPv%d): ib.ICRC %x, masked pseudo-header CRC %x", name, sf.Frame, sf.Family, got, sf.Masked)
		}
		if !bytes.Equal(sf.Wire, wire) {
			t.Errorf("%s frame %d: scapy script reads ICRC %x from the frame, the test %x", name, sf.Frame, sf.Wire, wire)
		}
		if rec.Error != "" {
			t.Errorf("%s frame %d: rocectl: %s", name, sf.Frame, rec.Error)
			continue
		}
		wantOK := bytes.Equal(sf.Masked, sf.Wire)
		if rec.ICRCOK != wantOK {
			t.Errorf("%s frame %d: rocectl icrc_ok=%v, independent CRC says %v", name, sf.Frame, rec.ICRCOK, wantOK)
		}
		if rec.ICRC != binary.LittleEndian.Uint32(wire) {
			t.Errorf("%s frame %d: rocectl icrc %#08x, frame carries %x", name, sf.Frame, rec.ICRC, wire)
		}
	}
	return v4, v6
}

func TestScapyICRCGenerated(t *testing.T) {
	py := needScapy(t)
	path, cases := generatedPCAP(t)
	res, err := ScapyICRC(toolCtx(t), py, scapyScript(t), path)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := crossCheckScapy(t, path, res[path])
	if v4+v6 != len(cases) || v4 == 0 || v6 == 0 {
		t.Errorf("checked %d IPv4 + %d IPv6 frames of %d generated", v4, v6, len(cases))
	}
	t.Logf("python %s: %d IPv4 frames against scapy and the masked CRC, %d IPv6 frames against the masked CRC", py, v4, v6)
}

func TestScapyICRCCaptures(t *testing.T) {
	py := needScapy(t)
	var v4, v6 int
	files := captures(t)
	res, err := ScapyICRC(toolCtx(t), py, scapyScript(t), files...)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		a, b := crossCheckScapy(t, f, res[f])
		v4, v6 = v4+a, v6+b
	}
	if v4 == 0 {
		t.Error("no RoCEv2 frame in the captures was checked")
	}
	t.Logf("%d captures: %d IPv4 and %d IPv6 RoCEv2 frames checked", len(files), v4, v6)
}

// TestScapyICRCDetects corrupts one covered byte of every generated frame and
// checks that scapy, the masked CRC and ib all notice, so the agreement above
// is not agreement on garbage.
func TestScapyICRCDetects(t *testing.T) {
	py := needScapy(t)
	cases, err := Generate(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	frames := Frames(cases)
	for i := range frames {
		frames[i] = bytes.Clone(frames[i])
		_, udpAndIB, _, ok := icrcInputs(frames[i])
		if !ok {
			t.Fatalf("%s: not RoCEv2", cases[i].Name)
		}
		udpAndIB[8+11] ^= 0x01 // low PSN bit: covered by the ICRC
	}
	path := filepath.Join(t.TempDir(), "corrupt.pcap")
	var buf bytes.Buffer
	if err := WritePCAP(&buf, frames); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := ScapyICRC(toolCtx(t), py, scapyScript(t), path)
	if err != nil {
		t.Fatal(err)
	}
	sfs := res[path]
	if len(sfs) != len(frames) {
		t.Fatalf("scapy script read %d frames, wrote %d", len(sfs), len(frames))
	}
	var stdout, stderr bytes.Buffer
	if code := pcapdump.Run([]string{path}, &stdout, &stderr); code != 1 {
		t.Errorf("rocectl pcap on corrupted frames: exit %d, want 1", code)
	}
	for i, sf := range sfs {
		if bytes.Equal(sf.Masked, sf.Wire) {
			t.Errorf("%s: masked CRC matches a corrupted frame", cases[i].Name)
		}
		if sf.Family == 4 && bytes.Equal(sf.Scapy, sf.Wire) {
			t.Errorf("%s: scapy ICRC matches a corrupted frame", cases[i].Name)
		}
		if err := ib.VerifyFrameICRC(frames[i]); !errors.Is(err, ib.ErrBadICRC) {
			t.Errorf("%s: ib.VerifyFrameICRC on a corrupted frame: %v", cases[i].Name, err)
		}
	}
}
