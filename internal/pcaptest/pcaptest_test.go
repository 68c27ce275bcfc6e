package pcaptest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// build writes a classic pcap file in byte order bo with the given frames;
// orig, when non-zero, overrides the wire length of every record.
func build(bo binary.ByteOrder, magic, linkType uint32, orig int, frames ...[]byte) []byte {
	h := make([]byte, FileHeaderSize)
	bo.PutUint32(h, magic)
	bo.PutUint16(h[4:], 2)
	bo.PutUint16(h[6:], 4)
	bo.PutUint32(h[16:], 65535)
	bo.PutUint32(h[20:], linkType)
	for i, f := range frames {
		r := make([]byte, RecordHeaderSize)
		bo.PutUint32(r, uint32(i))
		bo.PutUint32(r[8:], uint32(len(f)))
		o := len(f)
		if orig != 0 {
			o = orig
		}
		bo.PutUint32(r[12:], uint32(o))
		h = append(append(h, r...), f...)
	}
	return h
}

func TestReadByteOrders(t *testing.T) {
	frames := [][]byte{{1, 2, 3}, {}, bytes.Repeat([]byte{0xee}, 60)}
	for _, tc := range []struct {
		name  string
		bo    binary.ByteOrder
		magic uint32
	}{
		{"little micro", binary.LittleEndian, magicMicro},
		{"little nano", binary.LittleEndian, magicNano},
		{"big micro", binary.BigEndian, magicMicro},
		{"big nano", binary.BigEndian, magicNano},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := Read(build(tc.bo, tc.magic, LinkTypeEthernet, 0, frames...))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(frames) {
				t.Fatalf("got %d records, want %d", len(recs), len(frames))
			}
			for i, r := range recs {
				if !bytes.Equal(r.Data, frames[i]) || r.OrigLen != len(frames[i]) {
					t.Errorf("record %d: % x (orig %d), want % x", i, r.Data, r.OrigLen, frames[i])
				}
			}
			if got := Frames(recs); len(got) != 3 || !bytes.Equal(got[2], frames[2]) {
				t.Errorf("Frames: %x", got)
			}
		})
	}
}

func TestReadOrigLen(t *testing.T) {
	recs, err := Read(build(binary.LittleEndian, magicMicro, LinkTypeEthernet, 1500, []byte{9, 9}))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].OrigLen != 1500 || len(recs[0].Data) != 2 {
		t.Fatalf("got %+v", recs)
	}
}

func TestReadMalformed(t *testing.T) {
	good := build(binary.LittleEndian, magicMicro, LinkTypeEthernet, 0, []byte{1, 2, 3, 4})
	for name, b := range map[string][]byte{
		"empty":          nil,
		"short header":   good[:FileHeaderSize-1],
		"bad magic":      append([]byte{0, 0, 0, 0}, good[4:]...),
		"not ethernet":   build(binary.LittleEndian, magicMicro, 113, 0),
		"short record":   good[:FileHeaderSize+RecordHeaderSize-1],
		"short frame":    good[:len(good)-1],
		"huge incl_len":  build(binary.LittleEndian, magicMicro, LinkTypeEthernet, 0, make([]byte, 0)),
		"trailing bytes": append(append([]byte{}, good...), 0),
	} {
		if name == "huge incl_len" {
			b = append(b, make([]byte, RecordHeaderSize)...)
			binary.LittleEndian.PutUint32(b[FileHeaderSize+RecordHeaderSize+8:], 0xffffffff)
		}
		if _, err := Read(b); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err %v, want ErrFormat", name, err)
		}
	}
	if _, err := Read(good[:FileHeaderSize]); err != nil {
		t.Errorf("header-only file: %v", err)
	}
}

func TestReadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.pcap")
	if err := os.WriteFile(p, build(binary.BigEndian, magicMicro, LinkTypeEthernet, 0, []byte{7}), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadFile(p)
	if err != nil || len(recs) != 1 || recs[0].Data[0] != 7 {
		t.Fatalf("ReadFile: %v %+v", err, recs)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing.pcap")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// TestLabCaptures reads every lab capture, when present.
func TestLabCaptures(t *testing.T) {
	files := Files(t, "*.pcap")
	if len(files) == 0 {
		t.Skipf("no .pcap files under %s", CaptureDir(t))
	}
	for _, f := range files {
		recs, err := ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			t.Errorf("%s: no records", f)
		}
	}
}

// TestCaptureDirAbsent checks that a repository without ../shared next to it
// skips rather than fails.
func TestCaptureDirAbsent(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "repo")
	if err := os.MkdirAll(filepath.Join(repo, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(repo, "pkg"))
	if got := RepoRoot(t); got != repo {
		t.Fatalf("RepoRoot = %s, want %s", got, repo)
	}
	var reached bool
	ok := t.Run("skip", func(t *testing.T) {
		CaptureDir(t)
		reached = true
	})
	if !ok || reached {
		t.Fatalf("CaptureDir without captures: passed=%v returned=%v, want a skip", ok, reached)
	}
}
