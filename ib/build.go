package ib

import "net/netip"

// FrameSpec describes a RoCEv2 frame for Build and BuildIB. The extended
// header pointers must be non-nil exactly for the headers the opcode carries
// (Opcode.Info().Headers). A CNP's reserved block is written as zeros.
type FrameSpec struct {
	SrcMAC, DstMAC [6]byte
	VLAN           bool // add one 802.1Q tag
	VLANID         uint16
	VLANPCP        uint8

	// Src and Dst select IPv4 (both IPv4 or v4-mapped, as GIDs of IPv4
	// addresses are) or IPv6 (both IPv6).
	Src, Dst     netip.Addr
	TrafficClass uint8  // IPv4 TOS / IPv6 traffic class
	HopLimit     uint8  // IPv4 TTL / IPv6 hop limit
	FlowLabel    uint32 // IPv6 only (rxe sends 0)
	IPID         uint16 // IPv4 only; covered by the ICRC
	DontFragment bool   // IPv4 only; rxe always sets DF

	SrcPort uint16 // see RXESourcePort, FlowLabelToUDPSourcePort
	DstPort uint16 // 0 means RoCEv2Port
	// UDPChecksum computes a real UDP checksum instead of sending zero.
	UDPChecksum bool

	// BTH is written as given except PadCount, which Build derives from the
	// payload length.
	BTH          BTHFields
	RDETH        *RDETHFields
	DETH         *DETHFields
	RETH         *RETHFields
	AtomicETH    *AtomicETHFields
	AETH         *AETHFields
	AtomicAckETH *AtomicAckETHFields
	ImmDt        *ImmDtFields
	IETH         *IETHFields
	FETH         *FETHFields
	XRCETH       *XRCETHFields

	Payload []byte
}

// Static errors keep Build allocation-free even when it fails.
var (
	errSpecNil      = &SpecError{Field: "FrameSpec", Reason: "nil"}
	errSpecOpcode   = &SpecError{Field: "BTH.Opcode", Reason: "undefined opcode"}
	errSpecDestQP   = &SpecError{Field: "BTH.DestQP", Reason: "exceeds 24 bits"}
	errSpecPSN      = &SpecError{Field: "BTH.PSN", Reason: "exceeds 24 bits"}
	errSpecPayload  = &SpecError{Field: "Payload", Reason: "opcode carries no payload"}
	errSpecTooLong  = &SpecError{Field: "Payload", Reason: "frame exceeds the 64 KiB IP/UDP length limit"}
	errSpecSrc      = &SpecError{Field: "Src", Reason: "invalid address"}
	errSpecDst      = &SpecError{Field: "Dst", Reason: "invalid address"}
	errSpecFamily   = &SpecError{Field: "Dst", Reason: "address family differs from Src"}
	errSpecVLANID   = &SpecError{Field: "VLANID", Reason: "exceeds 12 bits"}
	errSpecVLANPCP  = &SpecError{Field: "VLANPCP", Reason: "exceeds 3 bits"}
	errSpecFlow     = &SpecError{Field: "FlowLabel", Reason: "exceeds 20 bits"}
	errSpecMissing  [len(headerOrder)]*SpecError
	errSpecUnwanted [len(headerOrder)]*SpecError
)

func init() {
	names := [...]string{
		HdrRDETH: "RDETH", HdrDETH: "DETH", HdrRETH: "RETH", HdrAtomicETH: "AtomicETH",
		HdrAETH: "AETH", HdrAtomicAckETH: "AtomicAckETH", HdrImmDt: "ImmDt", HdrIETH: "IETH",
		HdrFETH: "FETH", HdrXRCETH: "XRCETH", HdrCNPReserved: "CNP", HdrDCETH: "DCETH", HdrDCCETH: "DCCETH",
	}
	for i, h := range headerOrder {
		errSpecMissing[i] = &SpecError{Field: names[h], Reason: "nil but the opcode carries it"}
		errSpecUnwanted[i] = &SpecError{Field: names[h], Reason: "set but the opcode does not carry it"}
	}
}

// isIPv4 reports whether the spec selects IPv4 (by its source address).
func (s *FrameSpec) isIPv4() bool { return s.Src.Unmap().Is4() }

// padLen returns the pad that makes the payload a multiple of 4 bytes.
func (s *FrameSpec) padLen() int { return -len(s.Payload) & 3 }

// ibLen returns the length of BTH … ICRC.
func (s *FrameSpec) ibLen() int {
	hl := opcodeTable[s.BTH.Opcode].HeaderLen
	if hl == 0 {
		hl = BTHSize
	}
	return hl + len(s.Payload) + s.padLen() + ICRCSize
}

// encapLen returns the length of Ethernet, VLAN, IP and UDP headers.
func (s *FrameSpec) encapLen() int {
	n := EthernetSize + UDPSize
	if s.VLAN {
		n += VLANTagSize
	}
	if s.isIPv4() {
		n += IPv4Size
	} else {
		n += IPv6Size
	}
	return n
}

// Len returns the size of the frame Build writes for s (0 for a nil spec).
func (s *FrameSpec) Len() int {
	if s == nil {
		return 0
	}
	return s.encapLen() + s.ibLen()
}

// IBLen returns the size BuildIB writes for s (BTH … ICRC; 0 for a nil spec).
func (s *FrameSpec) IBLen() int {
	if s == nil {
		return 0
	}
	return s.ibLen()
}

// checkIB validates the IB half of s.
func (s *FrameSpec) checkIB() (*OpcodeInfo, error) {
	if s == nil {
		return nil, errSpecNil
	}
	info := &opcodeTable[s.BTH.Opcode]
	if !info.Valid {
		return nil, errSpecOpcode
	}
	if s.BTH.DestQP > PSNMask {
		return nil, errSpecDestQP
	}
	if s.BTH.PSN > PSNMask {
		return nil, errSpecPSN
	}
	present := [len(headerOrder)]bool{
		false, false, // DCETH, DCCETH: no opcode of the standard table carries them
		s.RDETH != nil, s.DETH != nil, s.XRCETH != nil, s.FETH != nil, s.RETH != nil,
		s.AtomicETH != nil, s.AETH != nil, s.AtomicAckETH != nil, s.ImmDt != nil, s.IETH != nil,
		info.Headers&HdrCNPReserved != 0, // nothing to supply
	}
	for i, h := range headerOrder {
		want := info.Headers&h != 0
		if want && !present[i] {
			return nil, errSpecMissing[i]
		}
		if !want && present[i] {
			return nil, errSpecUnwanted[i]
		}
	}
	if !info.Payload && len(s.Payload) != 0 {
		return nil, errSpecPayload
	}
	return info, nil
}

// BuildIB writes BTH … pad for s into buf followed by four zero bytes
// reserved for the ICRC, and returns the number of bytes written
// (s.IBLen()). It is the half of Build for link layers that do not own the
// IP header (the ICRC needs it; see ICRC). BuildIB does not allocate.
func BuildIB(buf []byte, s *FrameSpec) (int, error) {
	info, err := s.checkIB()
	if err != nil {
		return 0, err
	}
	n := s.ibLen()
	if n > 0xffff-IPv4Size-UDPSize { // the tighter (IPv4) limit
		return 0, errSpecTooLong
	}
	if len(buf) < n {
		return 0, ErrShortBuffer
	}
	s.writeIB(buf[:n], info)
	return n, nil
}

// writeIB encodes the IB packet into b (exactly s.ibLen() bytes).
func (s *FrameSpec) writeIB(b []byte, info *OpcodeInfo) {
	bth := s.BTH
	bth.PadCount = uint8(s.padLen())
	BTH(b).Encode(&bth)
	for i, h := range headerOrder {
		if info.Headers&h == 0 {
			continue
		}
		o := int(info.offsets[i])
		v := b[o : o+h.Size()]
		switch h {
		case HdrRDETH:
			RDETH(v).Encode(s.RDETH)
		case HdrDETH:
			DETH(v).Encode(s.DETH)
		case HdrRETH:
			RETH(v).Encode(s.RETH)
		case HdrAtomicETH:
			AtomicETH(v).Encode(s.AtomicETH)
		case HdrAETH:
			AETH(v).Encode(s.AETH)
		case HdrAtomicAckETH:
			AtomicAckETH(v).Encode(s.AtomicAckETH)
		case HdrImmDt:
			ImmDt(v).Encode(s.ImmDt)
		case HdrIETH:
			IETH(v).Encode(s.IETH)
		case HdrFETH:
			FETH(v).Encode(s.FETH)
		case HdrXRCETH:
			XRCETH(v).Encode(s.XRCETH)
		case HdrCNPReserved:
			clear(v)
		}
	}
	o := info.HeaderLen + copy(b[info.HeaderLen:], s.Payload)
	clear(b[o:]) // pad and ICRC placeholder
}

// Build writes the complete frame described by s into buf: Ethernet, the
// optional VLAN tag, IPv4 (with header checksum) or IPv6, UDP (checksum zero
// unless s.UDPChecksum), the IB headers, payload, zero pad and the ICRC. It
// returns the frame length (s.Len()). Build does not allocate. s.Payload may
// already sit in buf at its final offset (s.Len()-ICRCSize-pad-len(Payload)),
// which saves the copy of a payload read straight into the transmit buffer;
// it must not overlap buf anywhere else.
func Build(buf []byte, s *FrameSpec) (int, error) {
	info, err := s.checkIB()
	if err != nil {
		return 0, err
	}
	v4 := s.isIPv4()
	switch {
	case !s.Src.IsValid():
		return 0, errSpecSrc
	case !s.Dst.IsValid():
		return 0, errSpecDst
	case v4 != s.Dst.Unmap().Is4():
		return 0, errSpecFamily
	case s.VLANID > 0x0fff:
		return 0, errSpecVLANID
	case s.VLANPCP > 7:
		return 0, errSpecVLANPCP
	case !v4 && s.FlowLabel > 0xfffff:
		return 0, errSpecFlow
	}
	ibLen := s.ibLen()
	udpLen := UDPSize + ibLen
	maxUDP := 0xffff // IPv6 payload length
	if v4 {
		maxUDP -= IPv4Size // IPv4 total length includes the header
	}
	if udpLen > maxUDP {
		return 0, errSpecTooLong
	}
	n := s.encapLen() + ibLen
	if len(buf) < n {
		return 0, ErrShortBuffer
	}
	b := buf[:n]
	dport := s.DstPort
	if dport == 0 {
		dport = RoCEv2Port
	}
	h := EncapHeader{
		Dst: s.DstMAC, Src: s.SrcMAC, SrcAddr: s.Src, DstAddr: s.Dst,
		SrcPort: s.SrcPort, DstPort: dport, TOS: s.TrafficClass, TTL: s.HopLimit,
		FlowLabel: s.FlowLabel, IPID: s.IPID, DF: s.DontFragment,
		VLAN: s.VLAN, VLANID: s.VLANID, VLANPCP: s.VLANPCP,
	}
	off := h.Put(b, ibLen)
	ipLen := IPv6Size
	if v4 {
		ipLen = IPv4Size
	}
	ip := b[off-UDPSize-ipLen : off-UDPSize]
	dgram := b[off-UDPSize:]
	s.writeIB(dgram[UDPSize:], info)
	icrc := len(dgram) - ICRCSize
	PutICRC(dgram[icrc:], ICRC(ip, dgram[:icrc]))
	if s.UDPChecksum {
		// The ICRC masks the UDP checksum, so it can be computed last.
		UDP(dgram).SetChecksum(UDPChecksum(ip, dgram))
	}
	return n, nil
}
