package pcapdump

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/gopacket/gopacket/layers"

	"github.com/goroce/goroce/ib"
)

// Record is the decoded form of one frame, and the schema of the --json
// output (one object per line). A frame that is not RoCEv2, or that is but
// cannot be decoded, is written with only frame, error and not_roce (and
// file). Numbers are plain JSON numbers; 64-bit values (va, swap_add,
// compare, orig) can exceed 2^53, so decode them as integers, not floats.
type Record struct {
	File    string `json:"file,omitempty"` // set when several files are decoded
	Frame   int    `json:"frame"`          // 1-based
	Error   string `json:"error,omitempty"`
	NotRoCE bool   `json:"not_roce,omitempty"` // Error is "not RoCEv2", not a decoding failure

	IPVersion  int     `json:"ip_version"`
	Src        string  `json:"src"`
	Dst        string  `json:"dst"`
	VLAN       *uint16 `json:"vlan,omitempty"` // VLAN ID, when tagged
	UDPSport   uint16  `json:"udp_sport"`
	UDPDport   uint16  `json:"udp_dport"`
	Opcode     uint8   `json:"opcode"`
	OpcodeName string  `json:"opcode_name"`
	Solicited  bool    `json:"solicited"`
	MigReq     bool    `json:"mig_req"`
	Pad        uint8   `json:"pad"`
	TVer       uint8   `json:"tver"`
	PKey       uint16  `json:"pkey"`
	FECN       bool    `json:"fecn"`
	BECN       bool    `json:"becn"`
	DestQP     uint32  `json:"dest_qp"`
	AckReq     bool    `json:"ack_req"`
	PSN        uint32  `json:"psn"`

	DCETH     *DCETH     `json:"dceth,omitempty"`  // DC (goroce's framing, docs/dc.md)
	DCCETH    *DCCETH    `json:"dcceth,omitempty"` // DC CONNECT
	RDETH     *RDETH     `json:"rdeth,omitempty"`
	DETH      *DETH      `json:"deth,omitempty"`
	XRCETH    *XRCETH    `json:"xrceth,omitempty"`
	FETH      *FETH      `json:"feth,omitempty"`
	RETH      *RETH      `json:"reth,omitempty"`
	Atomic    *Atomic    `json:"atomic,omitempty"`
	AETH      *AETH      `json:"aeth,omitempty"`
	AtomicAck *AtomicAck `json:"atomic_ack,omitempty"`
	Imm       *uint32    `json:"imm,omitempty"`
	IETH      *uint32    `json:"ieth,omitempty"`

	PayloadLen int    `json:"payload_len"` // data bytes, pad excluded
	ICRC       uint32 `json:"icrc"`        // as carried: the CRC value, stored little-endian on the wire
	ICRCOK     bool   `json:"icrc_ok"`
}

// Extension header objects of Record.
type (
	DCETH struct {
		Key  uint64 `json:"key,omitempty"`  // requests and CONNECT: the DC access key
		DCTN uint32 `json:"dctn,omitempty"` // responses: the DCT number
	}
	DCCETH struct {
		Flags uint8  `json:"flags"`
		DCI   uint32 `json:"dci"`
		Conn  uint32 `json:"conn"`
	}
	RDETH struct {
		EEC uint32 `json:"eec"`
	}
	DETH struct {
		QKey  uint32 `json:"qkey"`
		SrcQP uint32 `json:"src_qp"`
	}
	XRCETH struct {
		SRQN uint32 `json:"srqn"`
	}
	FETH struct {
		Placement   uint8 `json:"placement"`
		Selectivity uint8 `json:"selectivity"`
	}
	RETH struct {
		VA     uint64 `json:"va"`
		RKey   uint32 `json:"rkey"`
		DMALen uint32 `json:"dma_len"`
	}
	Atomic struct {
		VA      uint64 `json:"va"`
		RKey    uint32 `json:"rkey"`
		SwapAdd uint64 `json:"swap_add"`
		Compare uint64 `json:"compare"`
	}
	AETH struct {
		Syndrome uint8  `json:"syndrome"` // the whole syndrome byte
		MSN      uint32 `json:"msn"`
	}
	AtomicAck struct {
		Orig uint64 `json:"orig"`
	}
)

// errorRecord is what an undecoded frame is written as, so that it carries
// none of the zero-valued packet fields.
type errorRecord struct {
	File    string `json:"file,omitempty"`
	Frame   int    `json:"frame"`
	Error   string `json:"error"`
	NotRoCE bool   `json:"not_roce,omitempty"`
}

// MarshalJSON writes a failed frame as frame/error only.
func (r *Record) MarshalJSON() ([]byte, error) {
	if r.Error != "" {
		return json.Marshal(errorRecord{File: r.File, Frame: r.Frame, Error: r.Error, NotRoCE: r.NotRoCE})
	}
	type plain Record // drops the method, so no recursion
	return json.Marshal((*plain)(r))
}

// Failed reports whether the frame counts against the exit status: it is
// RoCEv2 but undecodable, or its ICRC is wrong.
func (r *Record) Failed() bool {
	if r.Error != "" {
		return !r.NotRoCE
	}
	return !r.ICRCOK
}

// Decoder decodes frames into Records, reusing one ib.Packet.
type Decoder struct {
	// DC reads the RD opcode space as goroce's DC framing (ib.ParseDC), as
	// Wireshark reads it, instead of IBTA RD.
	DC  bool
	pkt ib.Packet
}

// Decode fills r (which it resets) from one captured frame.
func (d *Decoder) Decode(f Frame, r *Record) {
	file := r.File
	*r = Record{File: file, Frame: f.Number}
	if f.LinkType != layers.LinkTypeEthernet {
		r.Error = fmt.Sprintf("link type %v is not supported (only Ethernet)", f.LinkType)
		return
	}
	if why := notRoCE(f.Data); why != "" {
		r.Error = "not RoCEv2: " + why
		r.NotRoCE = true
		return
	}
	p := &d.pkt
	p.Reset()
	parse := ib.Parse
	if d.DC {
		parse = ib.ParseDC
	}
	if err := parse(f.Data, p); err != nil {
		r.Error = err.Error()
		if f.OrigLen > len(f.Data) {
			r.Error = fmt.Sprintf("%v (the capture kept %d of %d bytes)", err, len(f.Data), f.OrigLen)
		}
		return
	}

	if p.VLAN != nil {
		id := binary.BigEndian.Uint16(p.VLAN[0:2]) & 0x0fff
		r.VLAN = &id
	}
	// Addresses straight from the header bytes (IPv4 12..20, IPv6 8..40).
	if p.IPv4 != nil {
		r.IPVersion = 4
		r.Src = netip.AddrFrom4([4]byte(p.IPv4[12:16])).String()
		r.Dst = netip.AddrFrom4([4]byte(p.IPv4[16:20])).String()
	} else {
		r.IPVersion = 6
		r.Src = netip.AddrFrom16([16]byte(p.IPv6[8:24])).String()
		r.Dst = netip.AddrFrom16([16]byte(p.IPv6[24:40])).String()
	}
	r.UDPSport = binary.BigEndian.Uint16(p.UDP[0:2])
	r.UDPDport = binary.BigEndian.Uint16(p.UDP[2:4])

	b := p.BTH
	r.Opcode = uint8(b.Opcode())
	r.OpcodeName = p.Info.Name
	r.Solicited = b.Solicited()
	r.MigReq = b.MigReq()
	r.Pad = b.PadCount()
	r.TVer = b.TVer()
	r.PKey = b.PKey()
	r.FECN = b.FECN()
	r.BECN = b.BECN()
	r.DestQP = b.DestQP()
	r.AckReq = b.AckReq()
	r.PSN = uint32(b.PSN())

	if p.DCETH != nil {
		f := p.DCETH.Fields()
		if p.Info.IsRequest {
			r.DCETH = &DCETH{Key: f.Key}
		} else {
			r.DCETH = &DCETH{DCTN: f.DCTN}
		}
	}
	if p.DCCETH != nil {
		f := p.DCCETH.Fields()
		r.DCCETH = &DCCETH{Flags: f.Flags, DCI: f.DCI, Conn: f.Conn}
	}
	if p.RDETH != nil {
		r.RDETH = &RDETH{EEC: p.RDETH.Fields().EEC}
	}
	if p.DETH != nil {
		f := p.DETH.Fields()
		r.DETH = &DETH{QKey: f.QKey, SrcQP: f.SrcQP}
	}
	if p.XRCETH != nil {
		r.XRCETH = &XRCETH{SRQN: p.XRCETH.Fields().SRQN}
	}
	if p.FETH != nil {
		f := p.FETH.Fields()
		r.FETH = &FETH{Placement: f.Placement, Selectivity: f.Selectivity}
	}
	if p.RETH != nil {
		f := p.RETH.Fields()
		r.RETH = &RETH{VA: f.VA, RKey: f.RKey, DMALen: f.DMALen}
	}
	if p.AtomicETH != nil {
		f := p.AtomicETH.Fields()
		r.Atomic = &Atomic{VA: f.VA, RKey: f.RKey, SwapAdd: f.SwapAdd, Compare: f.Compare}
	}
	if p.AETH != nil {
		f := p.AETH.Fields()
		r.AETH = &AETH{Syndrome: uint8(f.Syndrome), MSN: f.MSN}
	}
	if p.AtomicAckETH != nil {
		r.AtomicAck = &AtomicAck{Orig: p.AtomicAckETH.Fields().Orig}
	}
	if p.ImmDt != nil {
		v := p.ImmDt.Fields().Imm
		r.Imm = &v
	}
	if p.IETH != nil {
		v := p.IETH.Fields().RKey
		r.IETH = &v
	}

	r.PayloadLen = len(p.Payload)
	r.ICRC = binary.LittleEndian.Uint32(p.ICRC)
	switch err := p.VerifyICRC(); {
	case err == nil:
		r.ICRCOK = true
	case errors.Is(err, ib.ErrBadICRC):
		r.ICRCOK = false
	default:
		r.Error = err.Error()
	}
}

// notRoCE says why a frame is positively something other than RoCEv2, or ""
// if it may be RoCEv2 (including frames too short to tell, which ib.Parse then
// reports as truncated).
func notRoCE(b []byte) string {
	const ethLen = 14
	if len(b) < ethLen {
		return ""
	}
	et := binary.BigEndian.Uint16(b[12:14])
	off := ethLen
	for et == 0x8100 || et == 0x88a8 {
		if len(b) < off+4 {
			return ""
		}
		et = binary.BigEndian.Uint16(b[off+2 : off+4])
		off += 4
	}
	var proto byte
	switch et {
	case 0x0800:
		if len(b) < off+20 {
			return ""
		}
		proto = b[off+9]
		if b[off+6]&0x3f != 0 || b[off+7] != 0 {
			// A fragment (MF set or non-zero offset) is not a whole RoCEv2
			// packet; RoCE never fragments.
			return "IPv4 fragment"
		}
		off += int(b[off]&0x0f) * 4
	case 0x86dd:
		if len(b) < off+40 {
			return ""
		}
		proto = b[off+6]
		off += 40
	default:
		return fmt.Sprintf("ethertype %#04x", et)
	}
	if proto != 17 {
		return fmt.Sprintf("IP protocol %d", proto)
	}
	if len(b) < off+4 {
		return ""
	}
	if dport := binary.BigEndian.Uint16(b[off+2 : off+4]); dport != ib.RoCEv2Port {
		return fmt.Sprintf("UDP port %d", dport)
	}
	return ""
}
