//go:build linux

package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/udplink"
)

// The kernel UDP link's own stream on loopback, in the shape of
// rocectl perf send-bw --loopback without the transport: one process, two
// links (127.0.0.1 and 127.0.0.2, kernel-chosen ports), a sender goroutine
// writing 64-byte frames in batches (GSO runs) with a window of
// outstanding frames, and a receiver goroutine reading them (GRO) and
// answering every ackEvery frames with a small frame that opens the
// window, as an ACK does. Both busy-poll their link as the device's
// waiters do. Run with GOMAXPROCS 1 and 2, it shows what a second CPU
// gives the link and the kernel alone, beside what it gives the stack
// (TestScaleTable).
const envStream = "GOROCE_BENCH_STREAM" // JSON streamConfig: run the stream and exit

type streamConfig struct {
	Frames   int `json:"frames"`
	Size     int `json:"size"`   // UDP payload bytes of a data frame
	Batch    int `json:"batch"`  // frames per link write
	Window   int `json:"window"` // frames sent and not yet acknowledged
	AckEvery int `json:"ack_every"`
}

type streamResult struct {
	Mpps    float64       `json:"mpps"`
	Frames  int           `json:"frames"`
	Elapsed time.Duration `json:"elapsed"`
	Procs   int           `json:"procs"`
	Err     string        `json:"err,omitempty"`
}

// streamMain runs the configured stream and prints its result as JSON.
func streamMain(cfgJSON string) {
	var cfg streamConfig
	res := streamResult{Procs: runtime.GOMAXPROCS(0)}
	err := json.Unmarshal([]byte(cfgJSON), &cfg)
	if err == nil {
		res, err = runStream(cfg)
	}
	if err != nil {
		res.Err = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Printf("%s\n", b)
	if err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// streamFrame builds a frame from src to dst with a payload of size bytes,
// the first 8 of which carry n.
func streamFrame(src, dst netip.AddrPort, size int, n uint64) []byte {
	h := link.Header{SrcAddr: src.Addr(), DstAddr: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), TTL: 64, DF: true}
	f := make([]byte, h.HeaderSize()+size)
	off := h.Put(f, size)
	binary.BigEndian.PutUint64(f[off:], n)
	return f
}

func runStream(cfg streamConfig) (streamResult, error) {
	res := streamResult{Procs: runtime.GOMAXPROCS(0)}
	if cfg.Frames <= 0 || cfg.Size < 16 || cfg.Batch <= 0 || cfg.Window < cfg.Batch || cfg.AckEvery <= 0 {
		return res, fmt.Errorf("bad stream config %+v", cfg)
	}
	opts := udplink.Options{EphemeralPort: true}
	a, err := udplink.ListenOptions(netip.MustParseAddrPort("127.0.0.1:0"), opts)
	if err != nil {
		return res, err
	}
	defer a.Close()
	b, err := udplink.ListenOptions(netip.MustParseAddrPort("127.0.0.2:0"), opts)
	if err != nil {
		return res, err
	}
	defer b.Close()
	aAddr, bAddr := a.LocalAddr(), b.LocalAddr()
	batch := make([][]byte, cfg.Batch)
	for i := range batch {
		batch[i] = streamFrame(aAddr, bAddr, cfg.Size, 0)
	}
	ackOff := len(streamFrame(bAddr, aAddr, 16, 0)) - 16

	// The link may drop a frame (a receive buffer full on a busy host):
	// the sender then stops after streamStall without an ACK, and the rate
	// counts what arrived until then. A run that lost more than 1 % is
	// not a measurement.
	type recvResult struct {
		got int
		err error
	}
	var stop atomic.Bool
	recvDone := make(chan recvResult, 1)
	go func() {
		ack := [][]byte{streamFrame(bAddr, aAddr, 16, 0)}
		got, acked := 0, 0
		count := func(frames [][]byte) { got += len(frames) }
		for i := 0; got < cfg.Frames && !stop.Load(); i++ {
			n, err := b.PollBatch(count)
			if err != nil {
				recvDone <- recvResult{got, err}
				return
			}
			if got/cfg.AckEvery > acked/cfg.AckEvery || (got >= cfg.Frames && acked < got) {
				binary.BigEndian.PutUint64(ack[0][len(ack[0])-16:], uint64(got))
				if _, err := b.WriteBatch(ack); err != nil {
					recvDone <- recvResult{got, err}
					return
				}
				acked = got
			}
			if n == 0 && i&3 == 3 {
				runtime.Gosched() // as a device's busy poll yields
			}
		}
		recvDone <- recvResult{got, nil}
	}()

	start := time.Now()
	end := start // the last ACK's arrival
	sent, acked := 0, 0
	readAck := func(frames [][]byte) {
		for _, f := range frames {
			if len(f) >= ackOff+8 {
				if v := int(binary.BigEndian.Uint64(f[ackOff:])); v > acked {
					acked = v
					end = time.Now()
				}
			}
		}
	}
	var serr error
	for i := 0; acked < cfg.Frames; i++ {
		for sent < cfg.Frames && sent-acked+cfg.Batch <= cfg.Window {
			k, err := a.WriteBatch(batch[:min(cfg.Batch, cfg.Frames-sent)])
			sent += k
			if err != nil {
				serr = fmt.Errorf("after %d frames: %w", sent, err)
				break
			}
		}
		n, err := a.PollBatch(readAck)
		if serr == nil && err != nil {
			serr = err
		}
		if serr != nil {
			break
		}
		if n == 0 {
			if i&3 == 3 {
				runtime.Gosched()
			}
			if i&1023 == 1023 && time.Since(end) > streamStall && time.Since(start) > streamStall {
				break // frames lost: the window stays closed
			}
		}
	}
	stop.Store(true)
	rr := <-recvDone
	if serr != nil {
		return res, serr
	}
	if rr.err != nil {
		return res, rr.err
	}
	if lost := cfg.Frames - rr.got; lost > cfg.Frames/100 {
		return res, fmt.Errorf("the link lost %d of %d frames", lost, cfg.Frames)
	}
	if acked >= cfg.Frames {
		end = time.Now()
	}
	res.Elapsed = end.Sub(start)
	res.Frames = rr.got
	if res.Elapsed > 0 {
		res.Mpps = float64(rr.got) / res.Elapsed.Seconds() / 1e6
	}
	return res, nil
}

// streamStall is how long the sender waits for an ACK before it takes the
// frames it waits for as lost.
const streamStall = 500 * time.Millisecond

// kernelStream runs the stream in a process of its own in ns with
// GOMAXPROCS procs and returns its rate in Mpps.
func kernelStream(ctx context.Context, ns *netnstest.NS, procs int, cfg streamConfig) (float64, error) {
	b, _ := json.Marshal(cfg)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envStream+"="+string(b), fmt.Sprintf("GOMAXPROCS=%d", procs))
	out, err := runClient(ns, cmd)
	var res streamResult
	if jerr := lastJSONLine(out, &res); jerr != nil {
		if err == nil {
			err = jerr
		}
		return 0, err
	}
	if res.Err != "" {
		return 0, errors.New(res.Err)
	}
	if err != nil {
		return 0, err
	}
	if res.Procs != procs {
		return 0, fmt.Errorf("stream ran with GOMAXPROCS %d, not %d", res.Procs, procs)
	}
	return res.Mpps, nil
}

// streamShape is the stream of TestScaleTable's send-bw cases: 64-byte
// messages (payload of a SEND_ONLY with its BTH and ICRC), the device's
// GSO runs (22 frames a write on average in those runs), and perftest's
// window (-t 128 over 8 QPs) and completion every 100 messages.
func streamShape(frames int) streamConfig {
	return streamConfig{Frames: frames, Size: 64 + 12 + 4, Batch: 22, Window: 8 * 128, AckEvery: 100}
}

// TestStreamConfigRefused: a stream asked for with nothing to send, a
// payload too short for its counter, no batch, a window narrower than a
// batch or no ACKs is refused before any socket opens.
func TestStreamConfigRefused(t *testing.T) {
	good := streamShape(1000)
	for name, mod := range map[string]func(*streamConfig){
		"no frames":        func(c *streamConfig) { c.Frames = 0 },
		"negative frames":  func(c *streamConfig) { c.Frames = -5 },
		"short payload":    func(c *streamConfig) { c.Size = 8 },
		"no batch":         func(c *streamConfig) { c.Batch = 0 },
		"window < batch":   func(c *streamConfig) { c.Window = c.Batch - 1 },
		"no ACKs":          func(c *streamConfig) { c.AckEvery = 0 },
		"negative ack gap": func(c *streamConfig) { c.AckEvery = -1 },
	} {
		cfg := good
		mod(&cfg)
		if _, err := runStream(cfg); err == nil || !strings.Contains(err.Error(), "bad stream config") {
			t.Errorf("%s: %+v: got %v, want a bad-config error", name, cfg, err)
		}
	}
}
