//go:build linux

package bpf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
)

const childEnv = "GOROCE_BPF_TEST_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		os.Exit(child(v))
	}
	os.Exit(m.Run())
}

var keep []any // keeps the child's program and attachment reachable

// child attaches the program to an interface, reports the program id on
// stdout and blocks until killed. Argument: "<ifindex>:<link|netlink>".
func child(arg string) int {
	if arg == "unprivileged" {
		_, err := Load(Options{})
		fmt.Printf("%v\n%v\n", errors.Is(err, ErrPermission), err)
		return 0
	}
	idx, how, _ := strings.Cut(arg, ":")
	ifindex, err := strconv.Atoi(idx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	forceNetlink = how == "netlink"
	p, err := Load(Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	a, err := p.Attach(ifindex, AttachDriver)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	id, err := p.ID()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	keep = append(keep, p, a)
	fmt.Printf("attached %d %v\n", id, a.ViaLink())
	select {}
}

// attachedIn reports Attached(ifindex) as seen inside ns.
func attachedIn(t *testing.T, ns *netnstest.NS, ifindex int) AttachInfo {
	t.Helper()
	var info AttachInfo
	if err := ns.Do(func() (err error) {
		info, err = Attached(ifindex)
		return err
	}); err != nil {
		t.Fatalf("Attached(%d): %v", ifindex, err)
	}
	return info
}

func TestAttachVeth(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mtu      int
		frags    bool
		mode     AttachMode
		netlink  bool
		wantMode AttachMode
	}{
		{"driver-1500", 1500, false, AttachDriver, false, AttachDriver},
		{"auto-1500", 1500, false, AttachAuto, false, AttachDriver},
		{"driver-3000", 3000, false, AttachDriver, false, AttachDriver},
		{"driver-9000-frags", 9000, true, AttachDriver, false, AttachDriver},
		{"auto-9000-no-frags", 9000, false, AttachAuto, false, AttachGeneric},
		{"generic-1500", 1500, false, AttachGeneric, false, AttachGeneric},
		{"generic-9000-frags", 9000, true, AttachGeneric, false, AttachGeneric},
		{"netlink-driver-1500", 1500, false, AttachDriver, true, AttachDriver},
		{"netlink-auto-9000-no-frags", 9000, false, AttachAuto, true, AttachGeneric},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := requireBPF(t, Options{Frags: tc.frags})
			pair := netnstest.NewPair(t, tc.mtu)
			if tc.netlink {
				forceNetlink = true
				defer func() { forceNetlink = false }()
			}
			var a *Attachment
			if err := pair.B.Do(func() (err error) {
				a, err = p.Attach(pair.VethB.Index, tc.mode)
				return err
			}); err != nil {
				t.Fatalf("Attach: %v", err)
			}
			if a.Mode() != tc.wantMode || a.ViaLink() == tc.netlink || a.Ifindex() != pair.VethB.Index {
				t.Fatalf("attached in %v mode (via link %v), want %v (netlink %v)", a.Mode(), a.ViaLink(), tc.wantMode, tc.netlink)
			}
			id, err := p.ID()
			if err != nil {
				t.Fatal(err)
			}
			info := attachedIn(t, pair.B, pair.VethB.Index)
			if !info.Attached || info.ProgramID != id || info.Mode != tc.wantMode || info.Name != "goroce_steer" {
				t.Fatalf("Attached = %+v, want program %d in %v mode", info, id, tc.wantMode)
			}
			checkTraffic(t, p, pair, tc.mtu)

			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if info := attachedIn(t, pair.B, pair.VethB.Index); info.Attached {
				t.Fatalf("still attached after Close: %+v", info)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// checkTraffic registers an AF_XDP socket on B's queue 0 and checks what
// reaches it and what reaches B's kernel stack.
func checkTraffic(t *testing.T, p *Program, pair *netnstest.Pair, mtu int) {
	t.Helper()
	var xsk *testXSK
	var roceSock, otherSock *net.UDPConn
	bAddr := pair.VethB.Addr.Addr()
	if err := pair.B.Do(func() (err error) {
		xsk = newTestXSK(t, pair.VethB.Index, 0)
		if roceSock, err = net.ListenUDP("udp4", &net.UDPAddr{Port: DefaultPort}); err != nil {
			return err
		}
		otherSock, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 5000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer roceSock.Close()
	defer otherSock.Close()
	if err := p.Register(0, xsk.fd); err != nil {
		t.Fatalf("Register: %v", err)
	}
	var tx *net.UDPConn
	if err := pair.A.Do(func() (err error) {
		tx, err = net.ListenUDP("udp4", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	send := func(port int, payload []byte) {
		t.Helper()
		if _, err := tx.WriteToUDPAddrPort(payload, netip.AddrPortFrom(bAddr, uint16(port))); err != nil {
			t.Fatalf("send to port %d: %v", port, err)
		}
	}
	before, _ := p.Stats()

	// RoCEv2 port: the AF_XDP socket gets the whole frame, the kernel
	// socket nothing.
	msg := []byte("roce-frame-for-the-xsk")
	var got []byte
	for try := 0; try < 20 && got == nil; try++ { // the first frame may wait for ARP
		send(DefaultPort, msg)
		var err error
		if got, err = xsk.recv(250 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if got == nil {
		t.Fatal("no frame on the AF_XDP socket")
	}
	if len(got) != 14+20+8+len(msg) || binary.BigEndian.Uint16(got[12:]) != 0x0800 ||
		binary.BigEndian.Uint16(got[14+20+2:]) != DefaultPort || !bytes.Equal(got[14+28:], msg) {
		t.Fatalf("AF_XDP socket got % x", got)
	}
	if n := readUDP(roceSock, 100*time.Millisecond); n >= 0 {
		t.Fatalf("kernel socket on port %d received %d bytes despite the redirect", DefaultPort, n)
	}

	// Other UDP port, small and (at jumbo MTU) multi-buffer: kernel.
	for _, size := range []int{100, mtu - 28} {
		send(5000, make([]byte, size))
		if n := readUDP(otherSock, 2*time.Second); n != size {
			t.Fatalf("kernel socket on port 5000: got %d bytes, want %d", n, size)
		}
	}
	if f, _ := xsk.recv(50 * time.Millisecond); f != nil {
		t.Fatalf("AF_XDP socket got a non-RoCE frame % x", f[:min(len(f), 64)])
	}

	// ICMP and TCP keep working.
	if err := pair.A.Ping(bAddr, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	tcpEcho(t, pair, mtu)

	after, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if after.Redirected <= before.Redirected || after.Passed <= before.Passed {
		t.Fatalf("stats before %+v after %+v", before, after)
	}

	// Without a socket for the queue, RoCEv2 frames reach the kernel.
	if err := p.Unregister(0); err != nil {
		t.Fatal(err)
	}
	send(DefaultPort, msg)
	if n := readUDP(roceSock, 2*time.Second); n != len(msg) {
		t.Fatalf("after Unregister the kernel socket got %d bytes", n)
	}
	if s, _ := p.Stats(); s.NoSocket <= after.NoSocket {
		t.Fatalf("NoSocket did not count: %+v", s)
	}
}

// readUDP returns the size of the next datagram, or -1 on timeout.
func readUDP(c *net.UDPConn, timeout time.Duration) int {
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 65536)
	n, err := c.Read(buf)
	if err != nil {
		return -1
	}
	return n
}

func tcpEcho(t *testing.T, pair *netnstest.Pair, mtu int) {
	t.Helper()
	var ln net.Listener
	if err := pair.B.Do(func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(pair.VethB.Addr.Addr(), 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	var c net.Conn
	if err := pair.A.Do(func() (err error) {
		c, err = net.DialTimeout("tcp4", ln.Addr().String(), 3*time.Second)
		return err
	}); err != nil {
		t.Fatalf("TCP connect across the veth: %v", err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("tcp-across-xdp "), 4*mtu/15)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("TCP echo: %v", err)
	}
}

// TestRedirectTestRun checks the XSKMAP key is ctx->rx_queue_index and that
// a registered socket turns the verdict into XDP_REDIRECT.
func TestRedirectTestRun(t *testing.T) {
	p := requireBPF(t, Options{Queues: 4})
	pair := netnstest.NewPairConfig(t, netnstest.VethConfig{Queues: 4})
	frameBytes := frame{payload: 32}.bytes()
	runAt := func(queue uint32) (uint32, Stats) {
		t.Helper()
		before, _ := p.Stats()
		var ret uint32
		err := pair.B.Do(func() (err error) {
			ctx := xdpMd{DataEnd: uint32(len(frameBytes)), IngressIfindex: uint32(pair.VethB.Index), RxQueueIndex: queue}
			ret, err = p.prog.Run(&ebpf.RunOptions{Data: frameBytes, Context: ctx})
			return err
		})
		if err != nil {
			t.Fatalf("test run on queue %d: %v", queue, err)
		}
		after, _ := p.Stats()
		return ret, after.sub(before)
	}
	var xsk *testXSK
	pair.B.Do(func() error { xsk = newTestXSK(t, pair.VethB.Index, 2); return nil })
	if err := p.Register(2, xsk.fd); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if ret, d := runAt(2); ret != xdpRedirect || d != (Stats{Redirected: 1}) {
		t.Fatalf("queue 2 (registered): action %d, counters %+v; want XDP_REDIRECT", ret, d)
	}
	if ret, d := runAt(0); ret != xdpPass || d != (Stats{NoSocket: 1}) {
		t.Fatalf("queue 0 (empty): action %d, counters %+v; want XDP_PASS", ret, d)
	}
	if err := p.Unregister(2); err != nil {
		t.Fatal(err)
	}
	if ret, d := runAt(2); ret != xdpPass || d != (Stats{NoSocket: 1}) {
		t.Fatalf("queue 2 after Unregister: action %d, counters %+v; want XDP_PASS", ret, d)
	}
	// A queue beyond the XSKMAP (Options.Queues) passes too.
	p = requireBPF(t, Options{Queues: 2})
	if ret, d := runAt(3); ret != xdpPass || d != (Stats{NoSocket: 1}) {
		t.Fatalf("queue 3 of a 2-entry XSKMAP: action %d, counters %+v; want XDP_PASS", ret, d)
	}
}

// xdpMd is struct xdp_md, the context of BPF_PROG_TEST_RUN.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// TestKilledProcess checks what is left on the interface after the process
// that attached the program is killed: nothing for a bpf_link, the program
// for the netlink fallback.
func TestKilledProcess(t *testing.T) {
	requireBPF(t, Options{})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"link", "netlink"} {
		t.Run(how, func(t *testing.T) {
			pair := netnstest.NewPair(t, 1500)
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%s", childEnv, pair.VethB.Index, how))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := pair.B.Start(cmd); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("child: %v: %s", err, stderr.String())
			}
			var id uint32
			var viaLink bool
			if _, err := fmt.Sscanf(line, "attached %d %t", &id, &viaLink); err != nil {
				t.Fatalf("child said %q: %v", line, err)
			}
			if viaLink != (how == "link") {
				t.Fatalf("child attached via link=%v", viaLink)
			}
			if info := attachedIn(t, pair.B, pair.VethB.Index); !info.Attached || info.ProgramID != id {
				t.Fatalf("Attached = %+v, want the child's program %d", info, id)
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			deadline := time.Now().Add(5 * time.Second)
			info := attachedIn(t, pair.B, pair.VethB.Index)
			for how == "link" && info.Attached && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				info = attachedIn(t, pair.B, pair.VethB.Index)
			}
			switch how {
			case "link":
				if info.Attached {
					t.Fatalf("program %d still attached 5s after SIGKILL", info.ProgramID)
				}
			case "netlink":
				// Documented: the rtnetlink fallback outlives the process.
				if !info.Attached || info.ProgramID != id {
					t.Fatalf("netlink attachment: Attached = %+v after SIGKILL, want program %d kept", info, id)
				}
				pair.B.Do(func() error {
					return netlink.LinkSetXdpFdWithFlags(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: pair.VethB.Index}}, -1, unix.XDP_FLAGS_DRV_MODE)
				})
			}
		})
	}
}

func TestAttachBadInput(t *testing.T) {
	p := requireBPF(t, Options{})
	pair := netnstest.NewPair(t, 1500)
	pair.B.Do(func() error {
		for _, idx := range []int{0, -1, 999999} {
			if _, err := p.Attach(idx, AttachAuto); !errors.Is(err, ErrNoInterface) {
				t.Errorf("Attach(%d): %v, want ErrNoInterface", idx, err)
			}
			if _, err := Attached(idx); !errors.Is(err, ErrNoInterface) {
				t.Errorf("Attached(%d): %v, want ErrNoInterface", idx, err)
			}
		}
		if _, err := p.Attach(pair.VethB.Index, AttachMode(42)); err == nil {
			t.Error("Attach with an unknown mode succeeded")
		}
		if _, err := p.Attach(pair.VethB.Index, AttachMulti); err == nil {
			t.Error("Attach in multi mode succeeded")
		}
		return nil
	})
	// veth0 lives in A: its index means nothing (or another link) in B's
	// namespace, and an index that exists nowhere must be refused.
	if info := attachedIn(t, pair.A, pair.VethA.Index); info.Attached {
		t.Fatalf("fresh veth has XDP: %+v", info)
	}

	// A second program on the same interface is refused, naming the first.
	other := requireBPF(t, Options{})
	var a *Attachment
	pair.B.Do(func() (err error) {
		a, err = p.Attach(pair.VethB.Index, AttachDriver)
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
		for _, m := range []AttachMode{AttachDriver, AttachGeneric, AttachAuto} {
			if _, err := other.Attach(pair.VethB.Index, m); !errors.Is(err, ErrBusy) {
				t.Errorf("second program (%v): %v, want ErrBusy", m, err)
			} else {
				t.Logf("second program (%v): %v", m, err)
			}
		}
		if _, err := p.Attach(pair.VethB.Index, AttachDriver); !errors.Is(err, ErrBusy) {
			t.Errorf("same program twice: %v, want ErrBusy", err)
		}
		return nil
	})
	// Program.Close detaches its attachments; Attachment.Close afterwards
	// is a no-op.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if info := attachedIn(t, pair.B, pair.VethB.Index); info.Attached {
		t.Fatalf("attached after Program.Close: %+v", info)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Attachment.Close after Program.Close: %v", err)
	}
}

// TestDriverModeNeedsFrags pins the veth limit the package documents: a
// program without frags support cannot run in driver mode on a veth whose
// peer MTU exceeds 3506, and the error says what to do.
func TestDriverModeNeedsFrags(t *testing.T) {
	p := requireBPF(t, Options{})
	pair := netnstest.NewPair(t, 9000)
	err := pair.B.Do(func() error {
		_, err := p.Attach(pair.VethB.Index, AttachDriver)
		return err
	})
	if err == nil {
		t.Fatal("driver mode attached without frags at MTU 9000")
	}
	if !errors.Is(err, unix.ERANGE) || !strings.Contains(err.Error(), "Options.Frags") {
		t.Fatalf("error %q does not point at Options.Frags", err)
	}
	t.Log(err)
}

// TestUnprivileged loads the program as user nobody: the error must be
// ErrPermission and name the capabilities.
func TestUnprivileged(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_SETUID, unix.CAP_SETGID)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is private to root; nobody needs a
	// copy it can execute.
	dir, err := os.MkdirTemp("", "goroce-bpf-unpriv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := dir + "/bpf.test"
	if err := os.WriteFile(copyPath, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(copyPath)
	cmd.Env = append(os.Environ(), childEnv+"=unprivileged")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as nobody: %v: %s", err, out)
	}
	isPerm, msg, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if isPerm != "true" || !strings.Contains(msg, "CAP_BPF") {
		t.Fatalf("Load as nobody: %s (ErrPermission: %s)", msg, isPerm)
	}
	t.Log(msg)
}

// TestInjectedFrames writes the crafted frames (VLAN and QinQ tags, IPv6,
// IPv4 options, truncations...) onto A's veth with a packet socket and
// checks that exactly the matching ones arrive, unchanged, on the AF_XDP
// socket behind the attached program.
func TestInjectedFrames(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW)
	for _, mode := range []AttachMode{AttachDriver, AttachGeneric} {
		t.Run(mode.String(), func(t *testing.T) {
			p := requireBPF(t, Options{})
			pair := netnstest.NewPair(t, 1500)
			var xsk *testXSK
			if err := pair.B.Do(func() error {
				if _, err := p.Attach(pair.VethB.Index, mode); err != nil {
					return err
				}
				xsk = newTestXSK(t, pair.VethB.Index, 0)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := p.Register(0, xsk.fd); err != nil {
				t.Fatal(err)
			}
			var fd int
			if err := pair.A.Do(func() (err error) {
				fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			to := &unix.SockaddrLinklayer{Ifindex: pair.VethA.Index, Halen: 6}
			copy(to.Addr[:], pair.VethB.HardwareAddr)
			for _, tc := range frameCases() {
				data := tc.f.bytes()
				copy(data[0:6], pair.VethB.HardwareAddr)
				copy(data[6:12], pair.VethA.HardwareAddr)
				if err := unix.Sendto(fd, data, 0, to); err != nil {
					t.Fatalf("%s: inject: %v", tc.name, err)
				}
				wait := 30 * time.Millisecond
				if tc.want == steer {
					wait = 2 * time.Second
				}
				got, err := xsk.recv(wait)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case tc.want == steer && !bytes.Equal(got, data):
					t.Errorf("%s: AF_XDP socket got % x, want % x", tc.name, got, data)
				case tc.want == pass && got != nil:
					t.Errorf("%s: frame reached the AF_XDP socket: % x", tc.name, got)
				}
			}
			st, err := p.Stats()
			if err != nil {
				t.Fatal(err)
			}
			steered := 0
			for _, tc := range frameCases() {
				if tc.want == steer {
					steered++
				}
			}
			if st.Redirected != uint64(steered) || st.NoSocket != 0 {
				t.Errorf("stats %+v, want %d redirected", st, steered)
			}
		})
	}
}

// TestMultiBufferFrame sends a path-MTU-4096 sized RoCEv2 frame (4170
// bytes, more than one 4096-byte UMEM chunk) across a jumbo veth: the frags
// program in driver mode must hand it whole to a multi-buffer AF_XDP socket.
func TestMultiBufferFrame(t *testing.T) {
	p := requireBPF(t, Options{Frags: true})
	pair := netnstest.NewPair(t, 9000)
	var xsk *testXSK
	if err := pair.B.Do(func() error {
		a, err := p.Attach(pair.VethB.Index, AttachDriver)
		if err != nil {
			return err
		}
		if a.Mode() != AttachDriver {
			return fmt.Errorf("mode %v", a.Mode())
		}
		xsk = newTestXSKFlags(t, pair.VethB.Index, 0, unix.XDP_USE_SG)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Register(0, xsk.fd); err != nil {
		t.Fatal(err)
	}
	var tx *net.UDPConn
	if err := pair.A.Do(func() (err error) {
		tx, err = net.ListenUDP("udp4", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	payload := make([]byte, 4170-14-20-8)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	var got []byte
	for try := 0; try < 20 && got == nil; try++ {
		if _, err := tx.WriteToUDPAddrPort(payload, netip.AddrPortFrom(pair.VethB.Addr.Addr(), DefaultPort)); err != nil {
			t.Fatal(err)
		}
		var err error
		if got, err = xsk.recv(250 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 4170 || !bytes.Equal(got[42:], payload) {
		t.Fatalf("AF_XDP socket got %d bytes, want the 4170-byte frame", len(got))
	}
}
