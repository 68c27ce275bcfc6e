package qp_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// addrFamily is a pair of peers and a third host on one IP family.
type addrFamily struct {
	name        string
	a, b, third netip.Addr
}

var addrFamilies = []addrFamily{
	{"IPv4", netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.66")},
	{"IPv6", netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::66")},
}

// forge builds a packet as an attacker who knows the QPN, PSN and keys would.
func forge(t *testing.T, op ib.Opcode, qpn uint32, psn uint32, ext, payload []byte) *ib.Packet {
	t.Helper()
	b := make([]byte, ib.BTHSize)
	pc := (-len(payload)) & 3
	ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: qpn, PSN: ib.PSN(psn), AckReq: true, PadCount: uint8(pc)})
	b = append(append(append(b, ext...), payload...), make([]byte, pc+4)...)
	var p ib.Packet
	if err := ib.ParseIB(b, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func aethBytes(syn ib.Syndrome, msn uint32) []byte {
	b := make([]byte, ib.AETHSize)
	ib.AETH(b).Encode(&ib.AETHFields{Syndrome: syn, MSN: msn})
	return b
}

func addrNet(t *testing.T, fam addrFamily) *qptest.Net {
	t.Helper()
	n, err := qptest.NewNet(qptest.Options{AddrA: fam.a, AddrB: fam.b})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSpoofedRequestDropped: requests with the right QPN, PSN, R_Key and range
// that come from a third address, or are addressed to an address other than
// the QP's own, are dropped before the responder sees them (rxe check_addr):
// no memory change, no completion, no ACK or NAK, and the connection still
// works afterwards.
func TestSpoofedRequestDropped(t *testing.T) {
	for _, fam := range addrFamilies {
		for _, typ := range []qp.QPType{qp.RC, qp.UC} {
			t.Run(fam.name+"/"+typ.String(), func(t *testing.T) {
				n := addrNet(t, fam)
				a, _ := qptest.NewEndpoint(n.A.E, typ, 8)
				b, _ := qptest.NewEndpoint(n.B.E, typ, 8)
				prm := qptest.DefaultRC
				prm.PSNA, prm.PSNB = 0x100, 0x200
				if err := n.Connect(a.QP, b.QP, prm); err != nil {
					t.Fatal(err)
				}
				mem := make([]byte, 4096)
				fill(mem, 3)
				orig := append([]byte(nil), mem...)
				mr, err := qp.RegMRWithKey(b.PD, mem, 0x10000, allAccess, 0x5151)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.QP.PostRecv(&qp.RecvWR{ID: 9, SGL: []qp.SGE{{Addr: 0x10000 + 2048, Length: 1024, LKey: mr.LKey()}}}); err != nil {
					t.Fatal(err)
				}
				evil := bytes.Repeat([]byte{0xEE}, 64)
				third := ib.GIDFromAddr(fam.third)
				srcs := []qp.Source{
					{SGID: third, DGID: n.B.GID},   // from a third host
					{SGID: n.A.GID, DGID: third},   // to another of B's addresses
					{SGID: n.B.GID, DGID: n.B.GID}, // B's own address as source
				}
				type req struct {
					op       ib.Opcode
					ext, pay []byte
				}
				writeImm, write, send := ib.RCWriteOnlyImm, ib.RCWriteOnly, ib.RCSendOnly
				if typ == qp.UC {
					writeImm, write, send = ib.UCWriteOnlyImm, ib.UCWriteOnly, ib.UCSendOnly
				}
				imm := []byte{1, 2, 3, 4}
				reqs := []req{
					{writeImm, append(rethBytes(0x10000, mr.RKey(), 64), imm...), evil},
					{write, rethBytes(0x10000+64, mr.RKey(), 64), evil},
					{send, nil, evil},
				}
				if typ == qp.RC {
					atom := make([]byte, ib.AtomicETHSize)
					binary.BigEndian.PutUint64(atom, 0x10000+128)
					binary.BigEndian.PutUint32(atom[8:], mr.RKey())
					binary.BigEndian.PutUint64(atom[12:], 0x1111)
					reqs = append(reqs,
						req{ib.RCFetchAdd, atom, nil},
						req{ib.RCReadRequest, rethBytes(0x10000, mr.RKey(), 256), nil})
				}
				for _, s := range srcs {
					for _, r := range reqs {
						src := s
						err := n.B.E.Receive(forge(t, r.op, b.QP.QPN(), prm.PSNA, r.ext, r.pay), &src)
						if !errors.Is(err, qp.ErrBadAddress) {
							t.Fatalf("%v from %v to %v: %v, want ErrBadAddress", r.op, s.SGID, s.DGID, err)
						}
					}
				}
				if !bytes.Equal(mem, orig) {
					t.Fatal("a spoofed request changed the memory region")
				}
				if wcs := pollAll(b.RCQ, nil); len(wcs) != 0 {
					t.Fatalf("spoofed requests completed: %+v", wcs)
				}
				slots := make([]qp.TxPacket, 4)
				for i := range slots {
					slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
				}
				if k := n.B.E.Transmit(slots); k != 0 {
					t.Fatalf("the responder answers spoofed requests (%d packets)", k)
				}
				if got, want := n.B.E.Stats().BadAddress, uint64(len(srcs)*len(reqs)); got != want {
					t.Fatalf("BadAddress = %d, want %d", got, want)
				}
				if b.QP.State() != qp.StateRTS {
					t.Fatalf("B is %v", b.QP.State())
				}

				// The real peer's WRITE_WITH_IMM still lands, at the PSN
				// the forgeries tried to take.
				src := make([]byte, 64)
				fill(src, 4)
				amr, _ := a.PD.RegMR(src, 0x4000, qp.AccessLocalWrite)
				if err := a.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRRDMAWriteWithImm, Flags: qp.SendSignaled, Imm: 7,
					SGL: []qp.SGE{{Addr: 0x4000, Length: 64, LKey: amr.LKey()}}, RemoteAddr: 0x10000, RKey: mr.RKey()}); err != nil {
					t.Fatal(err)
				}
				var rwc, swc []qp.WorkCompletion
				if err := n.Run(func() bool {
					rwc, swc = pollAll(b.RCQ, rwc), pollAll(a.SCQ, swc)
					return len(rwc) == 1 && len(swc) == 1
				}, time.Minute); err != nil {
					t.Fatal(err)
				}
				if rwc[0].Status != qp.WCSuccess || rwc[0].WRID != 9 || swc[0].Status != qp.WCSuccess {
					t.Fatalf("legitimate WRITE: recv %+v send %+v", rwc[0], swc[0])
				}
				if !bytes.Equal(mem[:64], src) || !bytes.Equal(mem[64:], orig[64:]) {
					t.Fatal("legitimate WRITE did not land as sent")
				}
			})
		}
	}
}

// TestSpoofedResponseDropped: an ACK from a third address must not complete
// a SEND, and a forged NAK must not fail it or move the QP to the error
// state; the real ACK completes it afterwards.
func TestSpoofedResponseDropped(t *testing.T) {
	for _, fam := range addrFamilies {
		t.Run(fam.name, func(t *testing.T) {
			n := addrNet(t, fam)
			a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 8)
			b, _ := qptest.NewEndpoint(n.B.E, qp.RC, 8)
			prm := qptest.DefaultRC
			prm.PSNA, prm.PSNB = 0x100, 0x200
			if err := n.Connect(a.QP, b.QP, prm); err != nil {
				t.Fatal(err)
			}
			rbuf := make([]byte, 256)
			rmr, _ := b.PD.RegMR(rbuf, 0, qp.AccessLocalWrite)
			if err := b.QP.PostRecv(&qp.RecvWR{ID: 5, SGL: []qp.SGE{{Length: 256, LKey: rmr.LKey()}}}); err != nil {
				t.Fatal(err)
			}
			msg := []byte("only the peer may acknowledge this")
			if err := a.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled | qp.SendInline, Inline: msg}); err != nil {
				t.Fatal(err)
			}
			// Take the SEND off the wire and hold it.
			slots := make([]qp.TxPacket, 4)
			for i := range slots {
				slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
			}
			if k := n.A.E.Transmit(slots); k != 1 {
				t.Fatalf("A sent %d packets, want 1", k)
			}
			held := append([]byte(nil), slots[0].Payload()...)

			third := ib.GIDFromAddr(fam.third)
			srcs := []qp.Source{{SGID: third, DGID: n.A.GID}, {SGID: n.B.GID, DGID: third}}
			syns := []ib.Syndrome{
				ib.SyndromeACKUnlimited,
				ib.NAKSyndrome(ib.NAKRemoteAccessError),
				ib.NAKSyndrome(ib.NAKInvalidRequest),
				ib.NAKSyndrome(ib.NAKPSNSequenceError),
				ib.RNRNAKSyndrome(ib.RNRTimer(1)),
			}
			for _, s := range srcs {
				for _, syn := range syns {
					src := s
					err := n.A.E.Receive(forge(t, ib.RCAck, a.QP.QPN(), prm.PSNA, aethBytes(syn, 1), nil), &src)
					if !errors.Is(err, qp.ErrBadAddress) {
						t.Fatalf("syndrome %v from %v to %v: %v, want ErrBadAddress", syn, s.SGID, s.DGID, err)
					}
				}
			}
			if wcs := pollAll(a.SCQ, nil); len(wcs) != 0 {
				t.Fatalf("forged responses completed the SEND: %+v", wcs)
			}
			if a.QP.State() != qp.StateRTS {
				t.Fatalf("forged NAK moved A to %v", a.QP.State())
			}
			if got, want := n.A.E.Stats().BadAddress, uint64(len(srcs)*len(syns)); got != want {
				t.Fatalf("BadAddress = %d, want %d", got, want)
			}
			st := n.A.E.Stats()
			if st.RNRNAKsRcvd != 0 || st.SeqNAKsRcvd != 0 || st.Retransmits != 0 {
				t.Fatalf("forged NAKs were acted on: %+v", st)
			}

			// Deliver the held SEND from the real peer; its real ACK completes it.
			var pkt ib.Packet
			if err := ib.ParseIB(held, &pkt); err != nil {
				t.Fatal(err)
			}
			if err := n.B.E.Receive(&pkt, &qp.Source{SGID: n.A.GID, DGID: n.B.GID}); err != nil {
				t.Fatal(err)
			}
			var rwc, swc []qp.WorkCompletion
			if err := n.Run(func() bool {
				rwc, swc = pollAll(b.RCQ, rwc), pollAll(a.SCQ, swc)
				return len(rwc) == 1 && len(swc) == 1
			}, time.Minute); err != nil {
				t.Fatal(err)
			}
			if swc[0].Status != qp.WCSuccess || swc[0].WRID != 1 || rwc[0].Status != qp.WCSuccess ||
				!bytes.Equal(rbuf[:rwc[0].ByteLen], msg) {
				t.Fatalf("legitimate SEND: send %+v recv %+v", swc[0], rwc[0])
			}
		})
	}
}
