package fpga_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// A negative GID index picks the host GID on the FPGA's /24, as PyRogue's
// detectGidIndex; a fixed index is taken as it is.
func TestGIDPick(t *testing.T) {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	defer lb.Close()
	dev, err := roce.OpenLink(la, roce.Options{Logger: quiet, Addrs: []netip.Addr{
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.168.5.1"), netip.MustParseAddr("fd00::1")}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	for _, tc := range []struct {
		fpga, want string
		err        error
	}{{"192.168.5.7", "192.168.5.1", nil}, {"10.0.0.9", "10.0.0.1", nil}, {"fd00::7", "fd00::1", nil}, {"172.16.0.2", "", roce.ErrNoGID}} {
		s, err := fpga.NewServer(dev, 1, -1, 0, 4)
		if err != nil {
			t.Fatal(err)
		}
		if g := s.GID(); g != (ib.GID{}) {
			t.Fatalf("GID %v before the FPGA is known", g)
		}
		err = s.SetFPGAGID(ib.GIDFromAddr(netip.MustParseAddr(tc.fpga)))
		if !errors.Is(err, tc.err) || (tc.err == nil && s.Addr().String() != tc.want) {
			t.Fatalf("FPGA %s: host %v, %v; want %s, %v", tc.fpga, s.Addr(), err, tc.want, tc.err)
		}
		if s.MaxPayload() != fpga.DefaultMaxPayload || s.MRLen() != 4*fpga.DefaultMaxPayload || s.MRAddr()%4096 != 0 {
			t.Fatalf("slab: %d × %d at %#x", s.MaxPayload(), s.Depth(), s.MRAddr())
		}
		s.Stop()
	}
	i, err := dev.GIDIndex(netip.MustParseAddr("192.168.5.1"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := fpga.NewServer(dev, 1, i, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.Addr() != netip.MustParseAddr("192.168.5.1") {
		t.Fatalf("GID index %d gives %v", i, s.Addr())
	}
	if _, err := fpga.NewServer(dev, 1, 40, 0, 4); err == nil {
		t.Fatal("an empty GID index was accepted")
	}
	if _, err := fpga.NewServer(dev, 1, 1, 1<<20, 1<<12); !errors.Is(err, fpga.ErrInvalidSetting) || !strings.Contains(err.Error(), "32-bit MR length") {
		t.Fatalf("a 4 GiB slab: %v", err)
	}
}
