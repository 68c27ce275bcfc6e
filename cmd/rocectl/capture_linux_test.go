package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/internal/wirecheck"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"golang.org/x/sys/unix"
)

// runIn runs rocectl args in-process on a thread in ns and returns the exit
// status, stdout and stderr.
func runIn(t *testing.T, ns *netnstest.NS, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := -1
	if err := ns.Do(func() error {
		code = run(args, &out, &errOut)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// rawSender writes whole Ethernet frames onto an interface with an
// AF_PACKET socket, bypassing the kernel's IP stack.
type rawSender struct {
	fd      int
	ifindex int
}

// newRawSender opens the sender on veth v; it must run in v's namespace.
func newRawSender(t *testing.T, v *netnstest.Veth) *rawSender {
	t.Helper()
	var s *rawSender
	err := v.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		s = &rawSender{fd: fd, ifindex: v.Index}
		return nil
	})
	if err != nil {
		t.Fatalf("AF_PACKET socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

func (s *rawSender) send(frame []byte) error {
	return unix.Sendto(s.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: s.ifindex, Halen: 6})
}

// udSend builds a UD SEND-only frame from a to b with the given PSN, UDP
// destination port and addresses (IPv4 or IPv6).
func udSend(t *testing.T, src, dst net.HardwareAddr, sip, dip netip.Addr, port uint16, psn uint32) []byte {
	t.Helper()
	spec := ib.FrameSpec{
		Src: sip, Dst: dip, HopLimit: 64, DontFragment: true,
		// A zero UDP checksum is not allowed over IPv6 (RFC 8200).
		UDPChecksum: dip.Is6() && !dip.Is4In6(),
		SrcPort:     ib.RXESourcePort(0x11), DstPort: port,
		BTH: ib.BTHFields{
			Opcode: ib.UDSendOnly, PKey: 0xFFFF, DestQP: 0x11, PSN: ib.PSN(psn),
		},
		DETH:    &ib.DETHFields{QKey: 0x11111111, SrcQP: 0x12},
		Payload: bytes.Repeat([]byte{byte(psn)}, 32+int(psn%7)),
	}
	copy(spec.SrcMAC[:], src)
	copy(spec.DstMAC[:], dst)
	buf := make([]byte, spec.Len())
	n, err := ib.Build(buf, &spec)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

func TestRoceFilterLayout(t *testing.T) {
	// Every jump must land inside the program, on or before the two
	// returns, and the last two instructions must be the returns.
	f := roceFilter(4791)
	for i, ins := range f {
		if ins.Code&0x07 == unix.BPF_JMP {
			for _, off := range []uint8{ins.Jt, ins.Jf} {
				if tgt := i + 1 + int(off); tgt >= len(f) {
					t.Errorf("instruction %d jumps to %d, past the end", i, tgt)
				}
			}
		}
	}
	if f[len(f)-2].Code != unix.BPF_RET|unix.BPF_K || f[len(f)-2].K == 0 || f[len(f)-1].Code != unix.BPF_RET|unix.BPF_K || f[len(f)-1].K != 0 {
		t.Errorf("program does not end in accept, drop: %+v", f[len(f)-2:])
	}
}

func TestCaptureUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"capture"}, &out, &errOut); code != 2 {
		t.Errorf("capture without -d/-w: exit %d", code)
	}
	if code := run([]string{"capture", "-d", "lo", "-w", "x", "-c", "-1"}, &out, &errOut); code != 2 {
		t.Errorf("negative count: exit %d", code)
	}
	out.Reset()
	if code := run([]string{"help", "capture"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "AF_PACKET") {
		t.Errorf("help capture: exit %d, %q", code, out.String())
	}
}

// TestCapture sends RoCEv2 frames (IPv4 and IPv6, one VLAN-tagged) and
// frames that must not match (another UDP port, ICMP) from one namespace,
// captures them with rocectl capture in the other, and checks the file with
// package ib and tshark.
func TestCapture(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	for _, ns := range []*netnstest.NS{p.A, p.B} {
		if err := ns.Do(func() error {
			// No DAD, so the addresses are usable at once.
			return exec.Command("sysctl", "-q", "-w", "net.ipv6.conf.all.accept_dad=0").Run()
		}); err != nil {
			t.Logf("sysctl: %v", err)
		}
	}
	a6 := netip.MustParseAddr("fd00:99::1")
	b6 := netip.MustParseAddr("fd00:99::2")
	// Tagged frames need no VLAN interface: packet sockets see them before
	// the kernel looks for one.
	file := filepath.Join(t.TempDir(), "cap.pcap")
	const want = 9
	done := make(chan struct{})
	var code int
	var stderr bytes.Buffer
	go func() {
		defer close(done)
		_ = p.B.Do(func() error {
			code = run([]string{"capture", "-d", p.VethB.Name, "-w", file, "-c", strconv.Itoa(want), "--duration", "20s"}, io.Discard, &stderr)
			return nil
		})
	}()

	s := newRawSender(t, p.VethA)
	a4, b4 := p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	sent := 0
	for psn := uint32(1); ; psn++ {
		select {
		case <-done:
		case <-time.After(10 * time.Millisecond):
			var frames [][]byte
			switch psn % 4 {
			case 0:
				frames = append(frames, udSend(t, p.VethA.HardwareAddr, p.VethB.HardwareAddr, a4, b4, ib.RoCEv2Port, psn))
			case 1:
				frames = append(frames, udSend(t, p.VethA.HardwareAddr, p.VethB.HardwareAddr, a6, b6, ib.RoCEv2Port, psn))
			case 2:
				// Another UDP port: filtered out.
				frames = append(frames, udSend(t, p.VethA.HardwareAddr, p.VethB.HardwareAddr, a4, b4, 4792, psn))
				frames = append(frames, udSend(t, p.VethA.HardwareAddr, p.VethB.HardwareAddr, a6, b6, 4792, psn))
			case 3:
				// Tagged: the kernel strips the tag, capture restores it.
				f := udSend(t, p.VethA.HardwareAddr, p.VethB.HardwareAddr, a4, netip.MustParseAddr("10.99.100.2"), ib.RoCEv2Port, psn)
				tagged := append(append(append([]byte{}, f[:12]...), 0x81, 0x00, 0x00, 100), f[12:]...)
				frames = append(frames, tagged)
			}
			for _, f := range frames {
				if err := s.send(f); err != nil {
					t.Fatalf("send: %v", err)
				}
				sent++
			}
			if psn < 2000 {
				continue
			}
			t.Fatal("capture did not finish")
		}
		break
	}
	if code != 0 {
		t.Fatalf("capture: exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), fmt.Sprintf("%d frames captured", want)) {
		t.Errorf("capture summary: %q", stderr.String())
	}

	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	r, err := pcapgo.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	var v4, v6, tagged, n int
	var icrcs []uint32
	for {
		data, ci, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if ci.CaptureLength != ci.Length || ci.Timestamp.IsZero() {
			t.Errorf("frame %d: capture info %+v", n, ci)
		}
		var pkt ib.Packet
		if err := ib.Parse(data, &pkt); err != nil {
			t.Errorf("frame %d: %v", n, err)
			continue
		}
		if err := pkt.VerifyICRC(); err != nil {
			t.Errorf("frame %d: %v", n, err)
		}
		if pkt.UDP.DstPort() != ib.RoCEv2Port {
			t.Errorf("frame %d: UDP port %d captured", n, pkt.UDP.DstPort())
		}
		switch {
		case pkt.VLAN != nil:
			tagged++
			if pkt.VLAN.VID() != 100 {
				t.Errorf("frame %d: VLAN %d, want 100", n, pkt.VLAN.VID())
			}
		case pkt.IPv4 != nil:
			v4++
		default:
			v6++
		}
		icrcs = append(icrcs, binary.BigEndian.Uint32(pkt.ICRC))
	}
	if n != want || v4 == 0 || v6 == 0 || tagged == 0 {
		t.Errorf("read %d frames (%d IPv4, %d IPv6, %d tagged), want %d of each kind", n, v4, v6, tagged, want)
	}

	frames, err := wirecheck.Tshark(context.Background(), file)
	if errors.Is(err, wirecheck.ErrToolMissing) {
		t.Skipf("tshark cross-check skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != n {
		t.Fatalf("tshark read %d frames, ib %d", len(frames), n)
	}
	for i, f := range frames {
		if pr := f.Problem(); pr != "" {
			t.Errorf("tshark frame %d: %s", i+1, pr)
		}
		got, err := strconv.ParseUint(f["infiniband.invariant.crc"], 0, 32)
		if err != nil || uint32(got) != icrcs[i] {
			t.Errorf("tshark frame %d: ICRC %q, want %#x", i+1, f["infiniband.invariant.crc"], icrcs[i])
		}
		if f["infiniband.bth.opcode"] != strconv.Itoa(int(ib.UDSendOnly)) {
			t.Errorf("tshark frame %d: opcode %q", i+1, f["infiniband.bth.opcode"])
		}
	}
}

// cmsg builds one control message as the kernel lays it out.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, (cmsgHdrLen+len(data)+7)&^7)
	binary.NativeEndian.PutUint64(b, uint64(cmsgHdrLen+len(data)))
	binary.NativeEndian.PutUint32(b[8:], uint32(level))
	binary.NativeEndian.PutUint32(b[12:], uint32(typ))
	copy(b[cmsgHdrLen:], data)
	return b
}

func auxdata(status uint32, tci, tpid uint16) []byte {
	b := make([]byte, auxSize)
	binary.NativeEndian.PutUint32(b[auxStatus:], status)
	binary.NativeEndian.PutUint16(b[auxVLANTCI:], tci)
	binary.NativeEndian.PutUint16(b[auxVLANTPID:], tpid)
	return b
}

func TestDecodeRecv(t *testing.T) {
	frame := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00, 0x45}
	ts := make([]byte, 16)
	binary.NativeEndian.PutUint64(ts, 1700000000)
	binary.NativeEndian.PutUint64(ts[8:], 123)
	oob := append(cmsg(unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS, ts),
		cmsg(unix.SOL_PACKET, unix.PACKET_AUXDATA, auxdata(unix.TP_STATUS_VLAN_VALID|unix.TP_STATUS_VLAN_TPID_VALID, 0x2064, 0x88a8))...)
	buf := make([]byte, 64)
	copy(buf[4:], frame)
	got, orig, when := decodeRecv(buf, 100, oob)
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x88, 0xa8, 0x20, 0x64, 0x08, 0x00, 0x45}
	if !bytes.Equal(got[:len(want)], want) || len(got) != 64 || orig != 104 || !when.Equal(time.Unix(1700000000, 123)) {
		t.Errorf("decodeRecv = % x (len %d), orig %d, ts %v", got[:len(want)], len(got), orig, when)
	}
	// No tag, no timestamp: the frame as received.
	copy(buf[4:], frame)
	got, orig, when = decodeRecv(buf, len(frame), cmsg(unix.SOL_PACKET, unix.PACKET_AUXDATA, auxdata(0, 5, 0)))
	if !bytes.Equal(got, frame) || orig != len(frame) || !when.IsZero() {
		t.Errorf("untagged: % x, %d, %v", got, orig, when)
	}
	// A tag without a TPID is 802.1Q.
	copy(buf[4:], frame)
	got, _, _ = decodeRecv(buf, len(frame), cmsg(unix.SOL_PACKET, unix.PACKET_AUXDATA, auxdata(unix.TP_STATUS_VLAN_VALID, 7, 0)))
	if got[12] != 0x81 || got[13] != 0 || got[15] != 7 {
		t.Errorf("802.1Q default: % x", got)
	}
}

func FuzzDecodeRecv(f *testing.F) {
	f.Add([]byte{1, 2, 3}, 3, cmsg(unix.SOL_PACKET, unix.PACKET_AUXDATA, auxdata(unix.TP_STATUS_VLAN_VALID, 1, 0)))
	f.Add(make([]byte, 20), 1<<20, cmsg(unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS, make([]byte, 16)))
	f.Add([]byte{}, 0, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 8, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte, n int, oob []byte) {
		buf := make([]byte, 4+len(data))
		copy(buf[4:], data)
		frame, orig, _ := decodeRecv(buf, n, oob)
		if n < 0 {
			if frame != nil {
				t.Fatal("frame for a negative length")
			}
			return
		}
		if len(frame) > len(buf) || orig < n || orig > n+4 {
			t.Fatalf("len %d of buffer %d, orig %d for n %d", len(frame), len(buf), orig, n)
		}
	})
}

// TestCaptureReadAllocs: receiving a frame and writing it to the pcap
// stream allocates nothing. recvmsg behaves the same on a datagram
// socketpair as on a packet socket, which needs no privilege here.
func TestCaptureReadAllocs(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "pair")
	c, err := newPacketCapture(f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pw := pcapgo.NewWriterNanos(io.Discard)
	if err := pw.WriteFileHeader(65535, 1); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1000)
	buf := make([]byte, 4+2048)
	oob := make([]byte, 256)
	allocs := testing.AllocsPerRun(200, func() {
		if err := unix.Send(fds[1], payload, 0); err != nil {
			t.Fatal(err)
		}
		frame, orig, ts, err := c.read(buf, oob)
		if err != nil || len(frame) != len(payload) || orig != len(payload) {
			t.Fatalf("read: %d/%d bytes, %v", len(frame), orig, err)
		}
		if err := pw.WritePacket(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(frame), Length: orig}, frame); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per frame", allocs)
	}
	// A frame longer than the buffer reports its real length.
	if err := unix.Send(fds[1], make([]byte, 3000), 0); err != nil {
		t.Fatal(err)
	}
	frame, orig, _, err := c.read(buf, oob)
	if err != nil || len(frame) != len(buf)-4 || orig != 3000 {
		t.Errorf("long frame: %d bytes, orig %d, %v", len(frame), orig, err)
	}
}

// udEnd is one side of a UD exchange between two goroce devices.
type udEnd struct {
	dev *roce.Device
	pd  *roce.PD
	cq  *roce.CQ
	qp  *roce.QP
	mr  *roce.MR
}

func newUDEnd(t *testing.T, ns *netnstest.NS, ifname string) *udEnd {
	t.Helper()
	e := &udEnd{}
	err := ns.Do(func() (err error) {
		e.dev, err = netdev.Open(context.Background(), ifname, netdev.Options{Link: netdev.LinkUDP})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.dev.Close() })
	if e.pd, err = e.dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = e.dev.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: e.cq, RecvCQ: e.cq}); err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Connect(context.Background(), &roce.ConnectAttr{QKey: 0x1234}); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = e.pd.RegisterMR(make([]byte, 8192), roce.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *udEnd) wait(t *testing.T) roce.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]roce.WorkCompletion
	for e.cq.Poll(wc[:]) == 0 {
		if err := e.cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
	if wc[0].Status != roce.WCSuccess {
		t.Fatalf("completion %+v", wc[0])
	}
	return wc[0]
}

// TestCaptureDeviceTraffic captures what a goroce device on the kernel UDP
// link really puts on the wire (IP and UDP headers built by the kernel) and
// checks every ICRC with package ib and tshark: the device must have
// computed them over the headers the kernel chose.
func TestCaptureDeviceTraffic(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	// Otherwise the kernel leaves the UDP checksum to the NIC (which a veth
	// never fills in), and tshark rightly reports it as bad, as tcpdump does
	// for frames captured on the sending host.
	disableTxChecksum(t, p.VethA)
	a := newUDEnd(t, p.A, p.VethA.Name)
	b := newUDEnd(t, p.B, p.VethB.Name)
	const n = 6
	file := filepath.Join(t.TempDir(), "dev.pcap")
	// Capture on the sender's side: the frames as they leave.
	var code int
	var stderr bytes.Buffer
	done := make(chan struct{})
	started := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.A.Do(func() error {
			close(started)
			code = run([]string{"capture", "-d", p.VethA.Name, "-w", file, "-c", strconv.Itoa(n), "--duration", "20s"}, io.Discard, &stderr)
			return nil
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ah, err := a.pd.CreateAH(ctx, roce.AddressVector{DGID: ib.GIDFromAddr(p.VethB.Addr.Addr())})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, 100, 1000, 1024, 3, 512}
	for i := 0; ; i++ {
		select {
		case <-done:
		default:
			if i > 500 {
				t.Fatal("capture did not finish")
			}
			size := sizes[i%len(sizes)]
			if err := b.qp.PostRecv(&roce.RecvWR{ID: uint64(i), SGL: []roce.SGE{b.mr.SGE(0, roce.GRHSize+size)}}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend(&roce.SendWR{ID: uint64(i), Opcode: roce.WRSend, Flags: roce.SendSignaled,
				SGL: []roce.SGE{a.mr.SGE(0, size)}, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1234}); err != nil {
				t.Fatal(err)
			}
			a.wait(t)
			b.wait(t)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		break
	}
	if code != 0 {
		t.Fatalf("capture: exit %d: %s", code, stderr.String())
	}
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	r, err := pcapgo.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got++
		var pkt ib.Packet
		if err := ib.Parse(data, &pkt); err != nil {
			t.Errorf("frame %d: %v", got, err)
			continue
		}
		if err := pkt.VerifyICRC(); err != nil {
			t.Errorf("frame %d (%v, IP ID %#x): %v", got, pkt.BTH.Opcode(), pkt.IPv4.ID(), err)
		}
		if pkt.BTH.DestQP() != b.qp.QPN() {
			t.Errorf("frame %d: destination QP %d, want %d", got, pkt.BTH.DestQP(), b.qp.QPN())
		}
	}
	if got != n {
		t.Errorf("%d frames in the file, want %d", got, n)
	}
	frames, err := wirecheck.Tshark(context.Background(), file)
	if errors.Is(err, wirecheck.ErrToolMissing) {
		t.Skipf("tshark cross-check skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		if pr := f.Problem(); pr != "" {
			t.Errorf("tshark frame %d: %s", i+1, pr)
		}
		if f["infiniband.bth.destqp"] == "" {
			t.Errorf("tshark frame %d: not dissected as InfiniBand: %v", i+1, f)
		}
	}
}

// disableTxChecksum turns off transmit checksum offload on v
// (ETHTOOL_STXCSUM, as "ethtool -K IFACE tx off").
func disableTxChecksum(t *testing.T, v *netnstest.Veth) {
	t.Helper()
	const ethtoolSTXCSUM = 0x17
	type ethtoolValue struct{ cmd, data uint32 }
	err := v.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		val := &ethtoolValue{cmd: ethtoolSTXCSUM}
		var ifr struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [16]byte
		}
		copy(ifr.name[:], v.Name)
		ifr.data = unsafe.Pointer(val)
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
		runtime.KeepAlive(val)
		if e != 0 {
			return e
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: turn off tx checksum offload: %v", v.Name, err)
	}
}
