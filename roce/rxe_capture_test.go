package roce

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/memlink"
)

// rxeCaptures returns the pcaps recorded from real rxe peers (shared/ next to
// the repository, where CI puts it).
func rxeCaptures(t *testing.T) []string {
	dir := filepath.Join("..", "..", "shared", "rxe-lab", "captures")
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*.pcap"))
	if len(files) == 0 {
		t.Skipf("no rxe captures under %s (shared/ is not next to the repository)", dir)
	}
	return files
}

// Every RoCEv2 frame rxe sent passes the device's receive checks (header
// walk, IB parse, ICRC), and the device's frame builder, given the same IB
// packet, addresses, ports, TOS/TTL and IP ID, reproduces rxe's frame byte for
// byte: IPv4 checksum and ICRC included.
func TestRXECaptures(t *testing.T) {
	var p ib.Packet
	total := 0
	for _, file := range rxeCaptures(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r, err := pcapgo.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for i := 1; ; i++ {
			frame, _, err := r.ReadPacketData()
			if err != nil {
				break
			}
			fr, err := link.ParseFrame(frame)
			if err != nil || fr.DstPort != ib.RoCEv2Port || fr.VLAN {
				continue // ARP, TCP of the out-of-band exchange, ...
			}
			total++
			if err := ib.ParseIB(frame[fr.Payload:fr.End], &p); err != nil {
				t.Fatalf("%s frame %d: %v", file, i, err)
			}
			crc := ib.ICRC(frame[fr.IPOffset:fr.UDPOffset], frame[fr.UDPOffset:fr.End-ib.ICRCSize])
			if crc != ib.GetICRC(frame[fr.End-ib.ICRCSize:fr.End]) {
				t.Fatalf("%s frame %d: ICRC %08x, frame has %08x", file, i, crc, ib.GetICRC(frame[fr.End-4:fr.End]))
			}
			rebuild(t, file, i, frame[:fr.End], fr)
		}
	}
	t.Logf("%d rxe frames checked", total)
}

// rebuild seals the captured IB packet with a device's frame builder and
// compares the result with the capture.
func rebuild(t *testing.T, file string, i int, frame []byte, fr link.Frame) {
	t.Helper()
	src, dst := net.HardwareAddr(frame[6:12]), net.HardwareAddr(frame[0:6])
	la, _ := memlink.PairWithOptions(memlink.Options{HardwareAddrA: src, MTU: 9000})
	d, err := OpenLink(la, Options{Addrs: []netip.Addr{fr.Src}, Neighbours: map[netip.Addr]net.HardwareAddr{fr.Dst: dst}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ibLen := fr.End - fr.Payload
	buf := make([]byte, txHeadroom+ibLen)
	copy(buf[txHeadroom:], frame[fr.Payload:fr.End])
	clear(buf[len(buf)-ib.ICRCSize:])
	tx := qp.TxPacket{Buf: buf, Headroom: txHeadroom, Len: ibLen, AV: qp.AddressVector{
		DGID: ib.GIDFromAddr(fr.Dst), SGID: ib.GIDFromAddr(fr.Src), TrafficClass: fr.TOS, HopLimit: fr.TTL,
		FlowLabel: fr.FlowLabel, SrcPort: fr.SrcPort}}
	if fr.Version == 4 {
		d.shards[0].ipID = uint16(frame[fr.IPOffset+4])<<8 | uint16(frame[fr.IPOffset+5]) - 1
		if frame[fr.IPOffset+6]&0x40 == 0 {
			t.Fatalf("%s frame %d: rxe frame without DF", file, i)
		}
	}
	got, _, ok := d.buildFrame(&tx, &d.shards[0])
	if !ok {
		t.Fatalf("%s frame %d: not built", file, i)
	}
	if !bytes.Equal(got, frame) {
		t.Fatalf("%s frame %d differs from rxe's:\n got %x\nwant %x", file, i, got, frame)
	}
}
