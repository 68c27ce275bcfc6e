//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/link/xdplink"
)

// The test binary doubles as the sender/receiver process: TestMain checks
// envRole before running any test.
const (
	envRole     = "GOROCE_LINKBENCH_ROLE" // "send" or "recv"
	envKind     = "GOROCE_LINKBENCH_KIND" // link.KindUDP or link.KindAFXDP
	envIf       = "GOROCE_LINKBENCH_IF"
	envLocal    = "GOROCE_LINKBENCH_LOCAL"
	envRemote   = "GOROCE_LINKBENCH_REMOTE"
	envDstMAC   = "GOROCE_LINKBENCH_DSTMAC"
	envSize     = "GOROCE_LINKBENCH_SIZE"
	envDuration = "GOROCE_LINKBENCH_DURATION"
)

// result is what a role process reports on its last stdout line.
type result struct {
	Frames  uint64        `json:"frames"`
	Bytes   uint64        `json:"bytes"`
	Elapsed time.Duration `json:"elapsed"`
	Errors  uint64        `json:"errors"`
	Mode    string        `json:"mode"`
	Err     string        `json:"err,omitempty"`
}

const batchSize = 64

// openLink opens the link under test in the current namespace.
func openLink(kind, ifname string, local netip.Addr) (link.Link, string, error) {
	switch kind {
	case link.KindUDP:
		l, err := udplink.ListenOptions(netip.AddrPortFrom(local, udplink.DefaultPort), udplink.Options{Batch: batchSize})
		if err != nil {
			return nil, "", err
		}
		return l, "kernel UDP", nil
	case link.KindAFXDP:
		l, err := xdplink.Open(ifname, xdplink.Options{FrameSize: 4096, Multibuffer: true, Batch: batchSize})
		if err != nil {
			return nil, "", err
		}
		return l, fmt.Sprintf("%v, zero-copy %v, multi-buffer %v", l.AttachMode(), l.Socket().ZeroCopy(), l.Socket().Multibuffer()), nil
	}
	return nil, "", fmt.Errorf("unknown link kind %q", kind)
}

// buildFrames returns a batch of identical frames of size bytes (Ethernet
// header included, FCS excluded) from src to dst on the RoCEv2 port.
func buildFrames(size int, srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr) ([][]byte, error) {
	h := link.Header{SrcAddr: src, DstAddr: dst, SrcPort: udplink.DefaultPort, DstPort: udplink.DefaultPort, TTL: 64, DF: true}
	copy(h.Src[:], srcMAC)
	copy(h.Dst[:], dstMAC)
	payload := size - h.HeaderSize()
	if payload < 16 {
		return nil, fmt.Errorf("frame size %d too small", size)
	}
	frames := make([][]byte, batchSize)
	for i := range frames {
		f := make([]byte, size)
		n := h.Put(f, payload)
		f[n] = 0x64 // UD SEND_ONLY opcode: looks like RoCE to anyone capturing
		for j := n + 1; j < size; j++ {
			f[j] = byte(j)
		}
		frames[i] = f
	}
	return frames, nil
}

// roleMain runs a sender or receiver process and exits.
func roleMain(role string) {
	out := bufio.NewWriter(os.Stdout)
	fail := func(err error) {
		fmt.Fprintf(out, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		out.Flush()
		os.Exit(1)
	}
	kind, ifname := os.Getenv(envKind), os.Getenv(envIf)
	local, err1 := netip.ParseAddr(os.Getenv(envLocal))
	if err1 != nil {
		fail(err1)
	}
	l, mode, err := openLink(kind, ifname, local)
	if err != nil {
		fail(err)
	}
	defer l.Close()
	in := bufio.NewReader(os.Stdin)
	fmt.Fprintln(out, "ready")
	out.Flush()

	var res result
	res.Mode = mode
	switch role {
	case "recv":
		res = receive(l, in)
		res.Mode = mode
	case "send":
		remote, err := netip.ParseAddr(os.Getenv(envRemote))
		if err != nil {
			fail(err)
		}
		dstMAC, _ := net.ParseMAC(os.Getenv(envDstMAC))
		size, _ := strconv.Atoi(os.Getenv(envSize))
		d, err := time.ParseDuration(os.Getenv(envDuration))
		if err != nil {
			fail(err)
		}
		frames, err := buildFrames(size, l.HardwareAddr(), dstMAC, local, remote)
		if err != nil {
			fail(err)
		}
		if _, err := in.ReadString('\n'); err != nil { // "go"
			fail(err)
		}
		res = send(l, frames, d)
		res.Mode = mode
	default:
		fail(fmt.Errorf("unknown role %q", role))
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(out, "result %s\n", b)
	out.Flush()
	os.Exit(0)
}

// receive counts frames until stdin reaches EOF.
func receive(l link.Link, in io.Reader) result {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, in)
		cancel()
	}()
	var res result
	var first time.Time
	fn := func(frames [][]byte) {
		for _, f := range frames {
			res.Bytes += uint64(len(f))
		}
		res.Frames += uint64(len(frames))
	}
	for {
		_, err := l.ReadBatch(ctx, fn)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				res.Err = err.Error()
			}
			break
		}
		if first.IsZero() {
			first = time.Now()
		}
	}
	if !first.IsZero() {
		res.Elapsed = time.Since(first)
	}
	return res
}

// send writes batches of frames for d and counts what the link accepted.
func send(l link.Link, frames [][]byte, d time.Duration) result {
	var res result
	start := time.Now()
	deadline := start.Add(d)
	for i := 0; ; i++ {
		if i%16 == 0 && time.Now().After(deadline) {
			break
		}
		n, err := l.WriteBatch(frames)
		res.Frames += uint64(n)
		res.Bytes += uint64(n * len(frames[0]))
		if err != nil {
			res.Errors++
			if errors.Is(err, link.ErrClosed) {
				res.Err = err.Error()
				break
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res
}

// proc is a role process started in a namespace.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	mode  string
}

// startRole starts the test binary as role inside ns (via start) and waits
// for it to report ready.
func startRole(start func(*exec.Cmd) error, role string, env ...string) (*proc, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := start(cmd); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	line, err := p.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		stdin.Close()
		cmd.Wait()
		if err == nil {
			err = errors.New(strings.TrimSpace(strings.TrimPrefix(line, "error ")))
		}
		return nil, fmt.Errorf("%s process: %w", role, err)
	}
	return p, nil
}

// finish closes the process's stdin (stopping a receiver) and reads its
// result.
func (p *proc) finish() (result, error) {
	p.stdin.Close()
	return p.result()
}

func (p *proc) result() (result, error) {
	defer p.cmd.Wait()
	var res result
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			return res, fmt.Errorf("no result: %w", err)
		}
		if rest, ok := strings.CutPrefix(line, "result "); ok {
			return res, json.Unmarshal([]byte(rest), &res)
		}
		if rest, ok := strings.CutPrefix(line, "error "); ok {
			return res, errors.New(strings.TrimSpace(rest))
		}
	}
}
