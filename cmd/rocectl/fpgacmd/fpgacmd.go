// Package fpgacmd is rocectl's "fpga" command: "fpga recv" runs a Rogue
// RoCEv2 receive server (package fpga) and "fpga send" the FPGA emulator
// (package fpga/emulator) on a goroce device.
//
// Both are scriptable the way a DAQ setup script drives the real pair. Each
// prints its own connection values as one JSON line on stdout and takes the
// other side's from flags or as one JSON line on stdin (lines that do not
// parse, or carry the same role, are skipped), then prints one final JSON
// line with its results. The order is the firmware's: the host's values
// first (recv prints them at once), the FPGA's in reply (send prints them
// once it is connected), then recv completes the connection. Frames the
// emulator sends before that are retransmitted (it retries forever by
// default). A control script starts recv, passes its first line to send's
// stdin, and passes send's first line to recv's stdin (or as flags:
// -peer-qpn, -peer-gid); the last line of each is its result.
//
// The emulator's payload is verifiable: frame i starts with i as a 64-bit
// big-endian number followed by byte(i·31 + j·7) at offset j; recv -verify
// checks it and counts differing frames as data errors.
package fpgacmd

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// Params is the JSON line each side prints (fields that do not apply are
// left out).
type Params struct {
	Role       string `json:"role"` // "host" or "fpga"
	QPN        uint32 `json:"qpn"`
	GID        string `json:"gid"`
	RqPSN      uint32 `json:"rq_psn"`
	SqPSN      uint32 `json:"sq_psn"`
	MRAddr     uint64 `json:"mr_addr,omitempty"`
	MRRKey     uint32 `json:"mr_rkey,omitempty"`
	MRLen      uint32 `json:"mr_len,omitempty"`
	MaxPayload int    `json:"max_payload,omitempty"`
	Depth      int    `json:"depth,omitempty"`
}

// Result is the final JSON line.
type Result struct {
	Role        string            `json:"role"`
	Frames      uint64            `json:"frames"`
	Bytes       uint64            `json:"bytes"`
	Seconds     float64           `json:"seconds"`
	FramesPerS  float64           `json:"frames_per_s"`
	Gbps        float64           `json:"gbps"`
	RNRNAKs     uint64            `json:"rnr_naks"`
	Retransmits uint64            `json:"retransmits,omitempty"`
	Errors      uint64            `json:"errors"`
	DataErrors  uint64            `json:"data_errors,omitempty"`
	Channels    map[string]uint64 `json:"channels,omitempty"`
	Error       string            `json:"error,omitempty"`
}

// RecvConfig configures "fpga recv".
type RecvConfig struct {
	GIDIndex   int        // host GID index; -1: the GID on FPGAAddr's subnet, or the first IPv4 one
	FPGAAddr   netip.Addr // the FPGA's address (also from its JSON line)
	MaxPayload int
	Depth      int
	PMTU       ib.MTU // 0: the port's active MTU
	RNRTimer   uint8
	Count      uint64        // stop after this many frames (0: until ctx ends or Idle)
	Idle       time.Duration // stop when no frame came for this long after the first (0: never)
	Verify     bool
	Hold       time.Duration // a slow consumer: keep each frame this long before releasing it
	Out        io.Writer     // frames written here (payload only), if set
	Peer       *Params       // the FPGA's values from flags; nil: read a line from stdin
	Write      bool          // accept only the gen-1 data path
	Send       bool          // accept only the gen-2 data path
	// Metrics, if set, gets the receive server's counters (fpga.Stats),
	// read at each scrape.
	Metrics *prometheus.Registry
}

// SendConfig configures "fpga send".
type SendConfig struct {
	Count   uint64
	Size    int
	Rate    float64 // frames per second; 0: as fast as the host takes them
	Channel uint8
	Write   bool
	PMTU    ib.MTU // 0: the port's active MTU
	Retry   uint8
	Peer    *Params // the host's values from flags; nil: read a line from stdin
	// Warn, if set, is told when Size is cut to the largest frame of the
	// path MTU (the caller sets it when the size was asked for explicitly).
	Warn io.Writer
}

// readPeer reads the other side's JSON line from r.
func readPeer(ctx context.Context, r io.Reader, want string) (*Params, error) {
	type res struct {
		p   *Params
		err error
	}
	ch := make(chan res, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var p Params
			if json.Unmarshal(sc.Bytes(), &p) == nil && p.Role == want {
				ch <- res{&p, nil}
				return
			}
		}
		err := sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		ch <- res{nil, fmt.Errorf("reading the %s's values: %w", want, err)}
	}()
	select {
	case r := <-ch:
		return r.p, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func printJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	w.Write(append(b, '\n'))
}

func parseGID(s string) (ib.GID, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ib.GID{}, fmt.Errorf("GID %q: %w", s, err)
	}
	return ib.GIDFromAddr(a), nil
}

// Pattern fills b with the verifiable payload of frame i.
func Pattern(b []byte, i uint64) {
	for j := range b {
		b[j] = byte(int(i)*31 + j*7)
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], i)
	copy(b, n[:])
}

// checkPattern reports whether b is frame i's payload.
func checkPattern(b []byte, i uint64) bool {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], i)
	for j := range b {
		want := byte(int(i)*31 + j*7)
		if j < 8 {
			want = n[j]
		}
		if b[j] != want {
			return false
		}
	}
	return true
}

// pickGIDIndex chooses the host GID without an FPGA address: the first IPv4
// GID, else the first that is not link-local.
func pickGIDIndex(dev *roce.Device) int {
	es := dev.GIDs()
	for _, e := range es {
		if e.Addr.Is4() {
			return e.Index
		}
	}
	for _, e := range es {
		if !e.Addr.IsLinkLocalUnicast() {
			return e.Index
		}
	}
	return 0
}

// Recv runs the receive server on dev: prints the host's values to stdout,
// takes the FPGA's from cfg.Peer or stdin, receives, and prints the result.
func Recv(ctx context.Context, dev *roce.Device, cfg RecvConfig, stdin io.Reader, stdout io.Writer, log *slog.Logger) (Result, error) {
	res := Result{Role: "host"}
	if cfg.PMTU == 0 {
		cfg.PMTU = dev.QueryPort().ActiveMTU
	}
	gidIndex := cfg.GIDIndex
	if gidIndex < 0 && !cfg.FPGAAddr.IsValid() {
		gidIndex = pickGIDIndex(dev)
	}
	s, err := fpga.NewServer(dev, 1, gidIndex, cfg.MaxPayload, cfg.Depth)
	if err != nil {
		return res, err
	}
	defer s.Stop()
	if log != nil {
		s.SetLogger(log)
	}
	if cfg.Metrics != nil {
		serverMetrics(cfg.Metrics, s)
	}
	switch {
	case cfg.Write && !cfg.Send:
		s.SetDataPath(fpga.DataPathWrite)
	case cfg.Send && !cfg.Write:
		s.SetDataPath(fpga.DataPathSend)
	}
	if cfg.FPGAAddr.IsValid() {
		if err := s.SetFPGAGID(ib.GIDFromAddr(cfg.FPGAAddr)); err != nil {
			return res, err
		}
	}
	printJSON(stdout, Params{Role: "host", QPN: s.QPN(), GID: s.GID().String(), RqPSN: s.RqPSN(), SqPSN: s.SqPSN(),
		MRAddr: s.MRAddr(), MRRKey: s.MRRKey(), MRLen: s.MRLen(), MaxPayload: s.MaxPayload(), Depth: s.Depth()})
	peer := cfg.Peer
	if peer == nil {
		if peer, err = readPeer(ctx, stdin, "fpga"); err != nil {
			return res, err
		}
	}
	fg, err := parseGID(peer.GID)
	if err != nil {
		return res, err
	}
	if !cfg.FPGAAddr.IsValid() {
		if err := s.SetFPGAGID(fg); err != nil {
			return res, err
		}
	}
	// PyRogue passes the host's SqPSN as fpgaRqPsn; a value from the FPGA
	// side is used when it gives one.
	psn := s.SqPSN()
	if peer.RqPSN != 0 {
		psn = peer.RqPSN
	}
	if err := s.CompleteConnection(ctx, peer.QPN, psn, cfg.PMTU, cfg.RNRTimer); err != nil {
		return res, err
	}
	base := dev.Counters()
	var (
		mu       sync.Mutex
		channels = map[string]uint64{}
		dataErr  atomic.Uint64
		n        atomic.Uint64
		first    atomic.Int64
		last     atomic.Int64
		outErr   error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var holdWG sync.WaitGroup
	consume := func(f fpga.Frame) {
		i := n.Add(1) - 1
		now := time.Now()
		if i == 0 {
			first.Store(now.UnixNano())
		}
		last.Store(now.UnixNano())
		if cfg.Verify && !checkPattern(f.Data(), i) {
			dataErr.Add(1)
		}
		mu.Lock()
		channels[fmt.Sprint(f.Channel())]++
		if cfg.Out != nil && outErr == nil {
			_, outErr = cfg.Out.Write(f.Data())
		}
		mu.Unlock()
		if cfg.Hold > 0 {
			f.Retain()
			holdWG.Add(1)
			time.AfterFunc(cfg.Hold, func() { f.Release(); holdWG.Done() })
		}
		if cfg.Count > 0 && i+1 >= cfg.Count {
			cancel()
		}
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.Serve(ctx, consume) }()
	if cfg.Idle > 0 {
		go func() {
			t := time.NewTicker(cfg.Idle / 4)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if l := last.Load(); l != 0 && time.Since(time.Unix(0, l)) > cfg.Idle {
					cancel()
					return
				}
			}
		}()
	}
	err = <-serveErr
	holdWG.Wait()
	st := s.Stats()
	c := dev.Counters()
	res.Frames, res.Bytes = st.Frames, st.Bytes
	res.RNRNAKs = c.SendRNRErr - base.SendRNRErr
	res.Errors = st.BadSlot + st.BadLength + st.BadOpcode + st.BadStatus
	res.DataErrors = dataErr.Load()
	mu.Lock()
	res.Channels = channels
	if outErr != nil && err == nil {
		err = fmt.Errorf("writing frames: %w", outErr)
	}
	mu.Unlock()
	if l := last.Load(); l != 0 && res.Frames > 1 {
		res.Seconds = time.Duration(l - first.Load()).Seconds()
		if res.Seconds > 0 {
			res.FramesPerS = float64(res.Frames-1) / res.Seconds
			res.Gbps = float64(res.Bytes) * 8 / res.Seconds / 1e9
		}
	}
	if err != nil {
		res.Error = err.Error()
		res.Errors++
	}
	printJSON(stdout, res)
	if err == nil && res.DataErrors > 0 {
		err = fmt.Errorf("%d frames differ from the emulator's pattern", res.DataErrors)
	}
	return res, err
}

// Send runs the emulator on dev: takes the host's values from cfg.Peer or
// stdin, connects, prints the FPGA's values, sends, and prints the result.
func Send(ctx context.Context, dev *roce.Device, cfg SendConfig, stdin io.Reader, stdout io.Writer) (Result, error) {
	res := Result{Role: "fpga"}
	if cfg.PMTU == 0 {
		cfg.PMTU = dev.QueryPort().ActiveMTU
	}
	if cfg.Retry == 0 {
		cfg.Retry = 7
	}
	e, err := emulator.New(dev, emulator.Config{PMTU: cfg.PMTU, Write: cfg.Write, RetryCnt: cfg.Retry})
	if err != nil {
		return res, err
	}
	defer e.Close()
	peer := cfg.Peer
	if peer == nil {
		if peer, err = readPeer(ctx, stdin, "host"); err != nil {
			return res, err
		}
	}
	hg, err := parseGID(peer.GID)
	if err != nil {
		return res, err
	}
	p, err := e.Connect(ctx, emulator.HostParams{QPN: peer.QPN, GID: hg, RqPSN: peer.RqPSN, SqPSN: peer.SqPSN,
		MRAddr: peer.MRAddr, MRRKey: peer.MRRKey, MaxPayload: peer.MaxPayload, Depth: peer.Depth})
	if err != nil {
		return res, err
	}
	printJSON(stdout, Params{Role: "fpga", QPN: p.QPN, GID: p.GID.String(), RqPSN: p.RqPSN, SqPSN: p.SqPSN})
	size := cfg.Size
	if size <= 0 || size > e.MaxFrame() {
		if size > 0 && cfg.Warn != nil {
			fmt.Fprintf(cfg.Warn, "rocectl fpga send: -size %d: cut to %d, the largest frame of the path MTU\n", size, e.MaxFrame())
		}
		size = e.MaxFrame()
	}
	buf := make([]byte, size)
	start := time.Now()
	var i uint64
	for ; cfg.Count == 0 || i < cfg.Count; i++ {
		if cfg.Rate > 0 {
			due := start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
		Pattern(buf, i)
		if err = e.Send(ctx, cfg.Channel, buf); err != nil {
			break
		}
	}
	if err == nil || errors.Is(err, context.Canceled) {
		err = e.Flush(ctx)
		if errors.Is(err, context.Canceled) && cfg.Count == 0 {
			err = nil // interrupted: the frames in flight are not waited for
		}
	}
	el := time.Since(start).Seconds()
	st := e.Stats()
	res.Frames, res.Bytes, res.RNRNAKs, res.Retransmits, res.Errors = st.Frames, st.Bytes, st.RNRNAKs, st.Retransmits, st.Errors
	res.Seconds = el
	if el > 0 {
		res.FramesPerS = float64(st.Frames) / el
		res.Gbps = float64(st.Bytes) * 8 / el / 1e9
	}
	if err != nil {
		res.Error = err.Error()
	}
	printJSON(stdout, res)
	return res, err
}

// serverMetrics registers the receive server's counters in reg.
func serverMetrics(reg *prometheus.Registry, s *fpga.Server) {
	st := func(get func(fpga.Stats) uint64) func() uint64 {
		return func() uint64 { return get(s.Stats()) }
	}
	devstat.CounterFuncs(reg, "fpga_server_", map[string]func() uint64{
		"frames":        st(func(x fpga.Stats) uint64 { return x.Frames }),
		"bytes":         st(func(x fpga.Stats) uint64 { return x.Bytes }),
		"bad_slot":      st(func(x fpga.Stats) uint64 { return x.BadSlot }),
		"bad_length":    st(func(x fpga.Stats) uint64 { return x.BadLength }),
		"bad_opcode":    st(func(x fpga.Stats) uint64 { return x.BadOpcode }),
		"bad_status":    st(func(x fpga.Stats) uint64 { return x.BadStatus }),
		"bad_duplicate": st(func(x fpga.Stats) uint64 { return x.BadDuplicate }),
		"bad_release":   st(func(x fpga.Stats) uint64 { return x.BadRelease }),
	}, map[string]string{
		"frames": "Frames received.", "bytes": "Payload bytes received.",
		"bad_slot":   "Completions with a work request ID out of range.",
		"bad_length": "Completions of zero length or longer than the slot.",
		"bad_opcode": "Completions of another data path.", "bad_status": "Error completions other than a flush.",
		"bad_duplicate": "Second completions of a slot not posted.", "bad_release": "Frames released twice.",
	})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fpga_server_held_slots",
		Help: "Slots consumers hold now."}, func() float64 { return float64(s.Stats().Held) }))
}
