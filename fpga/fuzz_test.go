package fpga

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// FuzzComplete feeds arbitrary completions to the server's completion
// handler: whatever a device reports, the server counts and reposts, and
// never panics or hands out a frame outside its slab.
func FuzzComplete(f *testing.F) {
	f.Add(uint64(0), uint8(0), uint8(128), uint32(100), uint32(0x101), uint8(2))
	f.Add(uint64(7), uint8(5), uint8(129), uint32(0), uint32(0), uint8(0))
	f.Add(uint64(1<<40), uint8(0), uint8(128), uint32(1<<31), uint32(0), uint8(2))
	la, lb := memlink.Pair(faultnetZero, faultnetZero)
	defer lb.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	peer := netip.MustParseAddr("10.0.0.2")
	dev, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Logger: quiet,
		Neighbours: map[netip.Addr]net.HardwareAddr{peer: lb.HardwareAddr()}})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	s, err := NewServer(dev, 1, -1, 256, 8)
	if err != nil {
		f.Fatal(err)
	}
	defer s.Stop()
	s.SetLogger(quiet)
	s.SetFPGAGID(ib.GIDFromAddr(peer))
	if err := s.slab.postAll(); err != nil {
		f.Fatal(err)
	}
	var held Frame
	s.Attach(ConsumerFunc(func(fr Frame) {
		if d := fr.Data(); len(d) != fr.Len() || len(d) == 0 || len(d) > 256 {
			panic("frame outside its slot")
		}
		held.Release() // a stale frame: counted, not honoured
		held = fr
	}))
	f.Fuzz(func(t *testing.T, wrid uint64, status, opcode uint8, n, imm uint32, flags uint8) {
		wc := roce.WorkCompletion{WRID: wrid, Status: roce.WCStatus(status), Opcode: roce.WCOpcode(opcode),
			ByteLen: n, Imm: imm, Flags: roce.WCFlags(flags)}
		if wc.Status == roce.WCWRFlushErr {
			return // stops the server: covered by the tests
		}
		s.complete(&wc, DataPath(flags%3))
	})
}

var faultnetZero = faultnet.Config{}
