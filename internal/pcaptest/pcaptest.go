package pcaptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// Classic pcap file magics as read little-endian: microsecond and
// nanosecond timestamps, in the writer's own byte order or swapped.
const (
	magicMicro        = 0xa1b2c3d4
	magicNano         = 0xa1b23c4d
	magicMicroSwapped = 0xd4c3b2a1
	magicNanoSwapped  = 0x4d3cb2a1
)

// Sizes of the classic pcap headers.
const (
	FileHeaderSize   = 24
	RecordHeaderSize = 16
)

// LinkTypeEthernet is the only link type ReadFile accepts: every lab
// capture holds Ethernet frames.
const LinkTypeEthernet = 1

// ErrFormat reports a file that is not a well-formed classic pcap file of
// Ethernet frames.
var ErrFormat = errors.New("pcaptest: malformed pcap")

// Record is one captured frame.
type Record struct {
	// Data is the captured bytes; it aliases the file contents.
	Data []byte
	// OrigLen is the frame's length on the wire; larger than len(Data)
	// when the capture's snaplen cut it short.
	OrigLen int
}

// Read parses a classic pcap file of either byte order held in b.
func Read(b []byte) ([]Record, error) {
	if len(b) < FileHeaderSize {
		return nil, fmt.Errorf("%w: short file header", ErrFormat)
	}
	var bo binary.ByteOrder
	switch m := binary.LittleEndian.Uint32(b); m {
	case magicMicro, magicNano:
		bo = binary.LittleEndian
	case magicMicroSwapped, magicNanoSwapped:
		bo = binary.BigEndian
	default:
		return nil, fmt.Errorf("%w: unsupported magic %#x", ErrFormat, m)
	}
	if lt := bo.Uint32(b[20:]); lt != LinkTypeEthernet {
		return nil, fmt.Errorf("%w: link type %d is not Ethernet", ErrFormat, lt)
	}
	var recs []Record
	for off := FileHeaderSize; off < len(b); {
		if len(b)-off < RecordHeaderSize {
			return nil, fmt.Errorf("%w: short record header at offset %d", ErrFormat, off)
		}
		incl := uint64(bo.Uint32(b[off+8:]))
		orig := int(bo.Uint32(b[off+12:]))
		off += RecordHeaderSize
		if incl > uint64(len(b)-off) {
			return nil, fmt.Errorf("%w: short record at offset %d", ErrFormat, off)
		}
		n := int(incl)
		recs = append(recs, Record{Data: b[off : off+n : off+n], OrigLen: orig})
		off += n
	}
	return recs, nil
}

// ReadFile reads and parses the classic pcap file at path.
func ReadFile(path string) ([]Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	recs, err := Read(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// Frames returns the captured bytes of each record.
func Frames(recs []Record) [][]byte {
	out := make([][]byte, len(recs))
	for i, r := range recs {
		out[i] = r.Data
	}
	return out
}

// RepoRoot returns the directory holding go.mod, searching upward from the
// test's working directory.
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// CaptureDir returns ../shared/rxe-lab/captures relative to the repository
// root, or skips the test when the shared lab captures are absent.
func CaptureDir(tb testing.TB) string {
	tb.Helper()
	d := filepath.Join(RepoRoot(tb), "..", "shared", "rxe-lab", "captures")
	if st, err := os.Stat(d); err != nil || !st.IsDir() {
		tb.Skipf("rxe captures not present at %s (CI places shared/ next to the repository)", d)
	}
	return d
}

// Files returns, in lexical order, every file below CaptureDir whose base
// name matches the filepath.Match pattern; it skips the test when the
// captures are absent.
func Files(tb testing.TB, pattern string) []string {
	tb.Helper()
	if _, err := filepath.Match(pattern, ""); err != nil {
		tb.Fatalf("pattern %q: %v", pattern, err)
	}
	var files []string
	err := filepath.WalkDir(CaptureDir(tb), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ok, _ := filepath.Match(pattern, d.Name()); ok {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}
