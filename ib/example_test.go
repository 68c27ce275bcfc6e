package ib_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/goroce/goroce/ib"
)

// Build an RC SEND ONLY to QP 0x12 the way rxe would send it from QP 0x11
// (this is test vector V1 of the wire reference).
func ExampleBuild() {
	spec := ib.FrameSpec{
		SrcMAC:       [6]byte{2, 0, 0, 0, 0, 1},
		DstMAC:       [6]byte{2, 0, 0, 0, 0, 2},
		Src:          netip.MustParseAddr("192.168.1.1"),
		Dst:          netip.MustParseAddr("192.168.1.2"),
		HopLimit:     64,
		IPID:         0x1234,
		DontFragment: true,
		SrcPort:      ib.RXESourcePort(0x11),
		BTH: ib.BTHFields{
			Opcode: ib.RCSendOnly,
			PKey:   0xffff,
			DestQP: 0x12,
			AckReq: true,
			PSN:    1,
		},
		Payload: []byte("Hello, RoCEv2!"),
	}
	buf := make([]byte, 9000) // reused for every packet; Build does not allocate
	n, err := ib.Build(buf, &spec)
	if err != nil {
		panic(err)
	}
	frame := buf[:n]
	fmt.Println("length:", n)
	fmt.Printf("pad: %d, ICRC: % x\n", ib.BTH(frame[42:]).PadCount(), frame[n-4:])
	// Output:
	// length: 74
	// pad: 2, ICRC: 9b ee 0b 28
}

// Parse a received frame, check its ICRC and dispatch on the opcode.
func ExampleParse() {
	frame := []byte{
		0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, // Ethernet
		0x45, 0x00, 0x00, 0x30, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0xb7, 0x68, // IPv4
		0xc0, 0xa8, 0x01, 0x02, 0xc0, 0xa8, 0x01, 0x01,
		0xf8, 0x06, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
		0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x01, // BTH
		0x1f, 0x00, 0x00, 0x01, // AETH
		0x34, 0xac, 0xb1, 0xc5, // ICRC
	}
	var p ib.Packet // reuse one Packet per receive loop; Parse does not allocate
	if err := ib.Parse(frame, &p); err != nil {
		panic(err)
	}
	if err := p.VerifyICRC(); err != nil {
		panic(err)
	}
	fmt.Println(p.BTH.Opcode(), "to QP", p.BTH.DestQP(), "PSN", p.BTH.PSN())
	if p.Info.IsAck {
		fmt.Println(p.AETH.Syndrome(), "MSN", p.AETH.MSN())
	}

	// A frame cut short is rejected with the layer and offset at fault.
	err := ib.Parse(frame[:40], &p)
	var pe *ib.ParseError
	fmt.Println(errors.Is(err, ib.ErrTruncated), errors.As(err, &pe) && pe.Layer == "ipv4")
	// Output:
	// RC ACKNOWLEDGE to QP 17 PSN 1
	// ACK credits=unlimited MSN 1
	// true true
}

// The opcode table says which headers an opcode carries and where.
func ExampleOpcode_Info() {
	info := ib.RCWriteOnlyImm.Info()
	fmt.Println(info.Name, info.Position, info.HeaderLen)
	fmt.Println("RETH at", info.Offset(ib.HdrRETH), "ImmDt at", info.Offset(ib.HdrImmDt))
	fmt.Println("consumes a receive WQE:", info.ConsumesRecvWQE)
	fmt.Println(ib.Opcode(0x15).Valid(), ib.Opcode(0x15))
	// Output:
	// RC RDMA_WRITE_ONLY_WITH_IMMEDIATE only 32
	// RETH at 12 ImmDt at 28
	// consumes a receive WQE: true
	// false Opcode(0x15)
}

// PSNs are 24-bit and compared modulo 2^24.
func ExamplePSNDiff() {
	last := ib.PSN(0xffffff)
	next := last.Next()
	fmt.Printf("%#x %d %v\n", uint32(next), ib.PSNDiff(next, last), last.Before(next))
	// Output: 0x0 1 true
}

// rxe picks the UDP source port from the QP number.
func ExampleRXESourcePort() {
	fmt.Printf("%#x\n", ib.RXESourcePort(1))
	// Output: 0xd872
}

// On a link where the kernel owns IP and UDP (a UDP socket on port 4791),
// build only the IB packet; the ICRC still covers the IP and UDP headers the
// kernel will send, so the sender reconstructs them to compute it.
func ExampleBuildIB() {
	spec := ib.FrameSpec{
		BTH:  ib.BTHFields{Opcode: ib.RCAck, PKey: 0xffff, DestQP: 0x11, PSN: 1},
		AETH: &ib.AETHFields{Syndrome: ib.SyndromeACKUnlimited, MSN: 1},
	}
	pkt := make([]byte, spec.IBLen())
	n, err := ib.BuildIB(pkt, &spec)
	if err != nil {
		panic(err)
	}

	// The headers the kernel will put in front (vector V3 of the wire reference).
	udpLen := uint16(ib.UDPSize + n)
	ip := ib.IPv4(make([]byte, ib.IPv4Size))
	ip.Encode(&ib.IPv4Fields{
		TotalLength: ib.IPv4Size + udpLen, ID: 1, DontFragment: true, TTL: 64,
		Protocol: ib.IPProtocolUDP,
		Src:      netip.MustParseAddr("192.168.1.2"), Dst: netip.MustParseAddr("192.168.1.1"),
	})
	udp := ib.UDP(make([]byte, ib.UDPSize))
	udp.Encode(&ib.UDPFields{SrcPort: ib.RXESourcePort(0x12), DstPort: ib.RoCEv2Port, Length: udpLen})
	ib.PutICRC(pkt[n-ib.ICRCSize:], ib.ICRCSplit(ip, udp, pkt[:n-ib.ICRCSize]))
	fmt.Printf("% x\n", pkt[:n])
	// Output: 11 00 ff ff 00 00 00 11 00 00 00 01 1f 00 00 01 34 ac b1 c5
}
