package wirecheck

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/goroce/goroce/ib"
)

// Case is one generated frame and the spec it was built from.
type Case struct {
	Name  string // e.g. "RC SEND_ONLY/v6/1"
	Spec  ib.FrameSpec
	Frame []byte
}

// variants is how many frames Generate builds per opcode and IP family: the
// first uses edge values (all-ones PSN, QPN, keys), the others random ones.
const variants = 3

// Generate builds frames for every opcode that ib defines, over IPv4 and
// IPv6, with field values that vary per frame (deterministically: the same
// seed gives the same frames).
func Generate(seed uint64) ([]Case, error) {
	var cases []Case
	for op := 0; op < 256; op++ {
		o := ib.Opcode(op)
		if !o.Info().Valid {
			continue
		}
		for _, v6 := range []bool{false, true} {
			for k := 0; k < variants; k++ {
				rng := rand.New(rand.NewPCG(seed, uint64(op)<<8|uint64(k)<<1|b2u(v6)))
				s := spec(o, v6, k, rng)
				fam := "v4"
				if v6 {
					fam = "v6"
				}
				name := fmt.Sprintf("%v/%s/%d", o, fam, k)
				buf := make([]byte, s.Len())
				n, err := ib.Build(buf, &s)
				if err != nil {
					return nil, fmt.Errorf("wirecheck: building %s: %w", name, err)
				}
				cases = append(cases, Case{Name: name, Spec: s, Frame: buf[:n]})
			}
		}
	}
	return cases, nil
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// spec returns the frame spec for variant k of opcode o.
func spec(o ib.Opcode, v6 bool, k int, rng *rand.Rand) ib.FrameSpec {
	info := o.Info()
	edge := k == 0
	u32 := func(edgeVal uint32) uint32 {
		if edge {
			return edgeVal
		}
		return rng.Uint32()
	}
	u24 := func(edgeVal uint32) uint32 { return u32(edgeVal) & 0xffffff }
	u64 := func(edgeVal uint64) uint64 {
		if edge {
			return edgeVal
		}
		return rng.Uint64()
	}

	s := ib.FrameSpec{
		SrcMAC:       [6]byte{0x52, 0x54, 0x00, 0x4d, 0x00, byte(rng.IntN(256))},
		DstMAC:       [6]byte{0x52, 0x54, 0x00, 0x4d, 0x01, byte(rng.IntN(256))},
		TrafficClass: uint8(rng.IntN(256)), // DSCP and ECN: masked in the ICRC
		HopLimit:     uint8(1 + rng.IntN(255)),
		IPID:         uint16(rng.Uint32()),
		DontFragment: k != 2,
		SrcPort:      uint16(0xc000 + rng.IntN(0x4000)),
		DstPort:      ib.RoCEv2Port,
		// IPv6 forbids a zero UDP checksum (tshark flags it); over IPv4 it is
		// optional, so one variant carries one.
		UDPChecksum: v6 || k == 1,
	}
	if k == 2 {
		// A VLAN-tagged variant, so the decoders must skip the tag.
		s.VLAN = true
		s.VLANID = uint16(1 + rng.IntN(4094))
		s.VLANPCP = uint8(rng.IntN(8))
	}
	if v6 {
		var a, b [16]byte
		a[0], a[1], a[2], a[3] = 0x20, 0x01, 0x0d, 0xb8
		b = a
		for i := 8; i < 16; i++ {
			a[i], b[i] = byte(rng.IntN(256)), byte(rng.IntN(256))
		}
		s.Src, s.Dst = netip.AddrFrom16(a), netip.AddrFrom16(b)
		s.FlowLabel = rng.Uint32() & 0xfffff
	} else {
		a := [4]byte{10, 77, byte(rng.IntN(256)), byte(1 + rng.IntN(254))}
		b := [4]byte{10, 77, byte(rng.IntN(256)), byte(1 + rng.IntN(254))}
		s.Src, s.Dst = netip.AddrFrom4(a), netip.AddrFrom4(b)
		if k == 1 {
			// GIDs as rxe stores them: IPv4-mapped IPv6 addresses still give
			// an IPv4 frame.
			s.Src, s.Dst = netip.AddrFrom16(s.Src.As16()), netip.AddrFrom16(s.Dst.As16())
		}
	}

	s.BTH = ib.BTHFields{
		Opcode:    o,
		Solicited: edge || rng.IntN(2) == 1,
		MigReq:    edge || rng.IntN(2) == 1,
		PKey:      uint16(u32(0xffff)),
		FECN:      edge || rng.IntN(2) == 1,
		BECN:      edge || rng.IntN(2) == 1,
		DestQP:    u24(0xffffff),
		AckReq:    edge || rng.IntN(2) == 1,
		PSN:       ib.PSN(u24(0xffffff)),
	}
	if info.Headers&ib.HdrRDETH != 0 {
		s.RDETH = &ib.RDETHFields{EEC: u24(0xffffff)}
	}
	if info.Headers&ib.HdrDETH != 0 {
		s.DETH = &ib.DETHFields{QKey: u32(0xffffffff), SrcQP: u24(0xffffff)}
	}
	if info.Headers&ib.HdrXRCETH != 0 {
		s.XRCETH = &ib.XRCETHFields{SRQN: u24(0xffffff)}
	}
	if info.Headers&ib.HdrFETH != 0 {
		s.FETH = &ib.FETHFields{Placement: uint8(1 + rng.IntN(2)), Selectivity: uint8(rng.IntN(2))}
	}
	if info.Headers&ib.HdrRETH != 0 {
		s.RETH = &ib.RETHFields{VA: u64(^uint64(0)), RKey: u32(0xffffffff), DMALen: u32(0x80000000)}
	}
	if info.Headers&ib.HdrAtomicETH != 0 {
		s.AtomicETH = &ib.AtomicETHFields{
			VA: u64(^uint64(7)), RKey: u32(0xffffffff), SwapAdd: u64(^uint64(0)), Compare: u64(0x8000000000000001),
		}
	}
	if info.Headers&ib.HdrAETH != 0 {
		syn := []ib.Syndrome{
			ib.SyndromeACKUnlimited,
			ib.ACKSyndrome(uint8(rng.IntN(31))),
			ib.RNRNAKSyndrome(ib.RNRTimer(rng.IntN(32))),
			ib.NAKSyndrome(ib.NAKCode(rng.IntN(5))),
		}[(k+int(o))%4]
		s.AETH = &ib.AETHFields{Syndrome: syn, MSN: u24(0xffffff)}
	}
	if info.Headers&ib.HdrAtomicAckETH != 0 {
		s.AtomicAckETH = &ib.AtomicAckETHFields{Orig: u64(^uint64(0))}
	}
	if info.Headers&ib.HdrImmDt != 0 {
		s.ImmDt = &ib.ImmDtFields{Imm: u32(0xffffffff)}
	}
	if info.Headers&ib.HdrIETH != 0 {
		s.IETH = &ib.IETHFields{RKey: u32(0xffffffff)}
	}
	if info.Payload {
		// Lengths 4n+0..3 across variants so every pad count occurs.
		n := 4*rng.IntN(64) + (k+int(o))%4
		if o&0x1f == 0x1d {
			n = 8 // ATOMIC_WRITE carries exactly 8 bytes
		}
		s.Payload = make([]byte, n)
		for i := range s.Payload {
			s.Payload[i] = byte(rng.IntN(256))
		}
	}
	return s
}

// WritePCAP writes frames as an Ethernet pcap file, one millisecond apart.
func WritePCAP(w io.Writer, frames [][]byte) error {
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		return err
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, f := range frames {
		ci := gopacket.CaptureInfo{
			Timestamp:     t0.Add(time.Duration(i) * time.Millisecond),
			CaptureLength: len(f),
			Length:        len(f),
		}
		if err := pw.WritePacket(ci, f); err != nil {
			return err
		}
	}
	return nil
}

// Frames returns the frames of cases, in order.
func Frames(cases []Case) [][]byte {
	out := make([][]byte, len(cases))
	for i, c := range cases {
		out[i] = c.Frame
	}
	return out
}
