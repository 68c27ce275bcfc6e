package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/internal/errtimeout"
	"github.com/goroce/goroce/roce"
)

// Defaults of the rping tool.
const (
	DefaultPort = 7174
	DefaultSize = 64
	// MinSize is RPING_MIN_BUFSIZE: room for "rdma-ping-%d: " with any int.
	MinSize = len("2147483647") + 1 + len("rdma-ping-%d: ") + 1
	// MaxSize is RPING_BUFSIZE − 1.
	MaxSize  = 64*1024 - 1
	infoSize = 16 // struct rping_rdma_info: be64 buf, be32 rkey, be32 size
	sqDepth  = 16 // RPING_SQ_DEPTH
)

// Errors of a run.
var (
	// ErrMismatch is a -V failure: the data written back differs.
	ErrMismatch = errors.New("rping: data mismatch")
	// ErrProtocol reports a message of the wrong size or order from the peer.
	ErrProtocol = errors.New("rping: protocol error")
	// ErrConnectTimeout is the client's connect step (address resolution
	// and the connection handshake) running out of Config.ConnectTimeout.
	ErrConnectTimeout = errtimeout.New("rping: the connect step expired")
)

// Connect step bounds of the client, as rdma_cm's: rping gives address and
// route resolution 2 s each, and a REQ is answered within a few seconds
// when anybody listens. Without these the whole run's context is all that
// bounds cm.Dial, which retries a REQ nobody answers for over a minute and
// a half.
const (
	// DefaultConnectTimeout bounds the whole connect step.
	DefaultConnectTimeout = 20 * time.Second
	// DefaultConnectAttempt bounds one try of it; a try that expires is
	// started again while DefaultConnectTimeout lasts.
	DefaultConnectAttempt = 5 * time.Second
)

// Config is what the rping flags select.
type Config struct {
	Size     int       // -S, ping data size (default 64)
	Count    int       // -C, pings (0: until interrupted)
	Verbose  bool      // -v, print the ping data
	Validate bool      // -V, compare the data written back
	Out      io.Writer // where -v prints (default io.Discard)
	// ConnectTimeout bounds the client's connect step, every try of it
	// (0: DefaultConnectTimeout); ConnectAttempt bounds one try (0:
	// DefaultConnectAttempt, at most ConnectTimeout). A rejection ends the
	// step at once.
	ConnectTimeout, ConnectAttempt time.Duration
}

func (c *Config) check() error {
	if c.Size == 0 {
		c.Size = DefaultSize
	}
	if c.Size < MinSize || c.Size > MaxSize {
		return fmt.Errorf("rping: invalid size %d (valid range is %d to %d)", c.Size, MinSize, MaxSize)
	}
	if c.Count < 0 {
		return fmt.Errorf("rping: invalid count %d", c.Count)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.ConnectTimeout < 0 || c.ConnectAttempt < 0 {
		return fmt.Errorf("rping: negative connect timeout")
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ConnectAttempt == 0 {
		c.ConnectAttempt = DefaultConnectAttempt
	}
	c.ConnectAttempt = min(c.ConnectAttempt, c.ConnectTimeout)
	return nil
}

// endpoint holds one side's buffers and the connection.
type endpoint struct {
	cfg     Config
	conn    *cm.Conn
	recvBuf []byte // the peer's rping_rdma_info
	sendBuf []byte // ours
	rdma    []byte // the server's sink / the client's sink
	recvMR  *roce.MR
	sendMR  *roce.MR
	rdmaMR  *roce.MR
	start   []byte // the client's source buffer
	startMR *roce.MR
	wc      [4]roce.WorkCompletion
}

// prepare registers the buffers in the connection's PD and posts the
// receive before the connection is up, as rping does.
func (e *endpoint) prepare(c *cm.Conn, client bool) error {
	e.conn = c
	pd := c.PD()
	var err error
	e.recvBuf, e.sendBuf = make([]byte, infoSize), make([]byte, infoSize)
	if e.recvMR, err = pd.RegisterMR(e.recvBuf, roce.AccessLocalWrite); err != nil {
		return err
	}
	if e.sendMR, err = pd.RegisterMR(e.sendBuf, 0); err != nil {
		return err
	}
	access := roce.AccessLocalWrite | roce.AccessRemoteRead | roce.AccessRemoteWrite
	e.rdma = make([]byte, e.cfg.Size)
	if e.rdmaMR, err = pd.RegisterMR(e.rdma, access); err != nil {
		return err
	}
	if client {
		e.start = make([]byte, e.cfg.Size)
		if e.startMR, err = pd.RegisterMR(e.start, access); err != nil {
			return err
		}
	}
	return e.postRecv()
}

func (e *endpoint) postRecv() error {
	return e.conn.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{e.recvMR.SGE(0, infoSize)}})
}

func (e *endpoint) close() {
	for _, mr := range []*roce.MR{e.recvMR, e.sendMR, e.rdmaMR, e.startMR} {
		if mr != nil {
			_ = mr.Close()
		}
	}
	e.recvMR, e.sendMR, e.rdmaMR, e.startMR = nil, nil, nil, nil
}

// qpCap is rping's QP: a few sends, two receives, one SGE each.
var qpCap = roce.QPCap{MaxSendWR: sqDepth, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}

func qpOptions(e *endpoint, client bool) cm.QPOptions {
	// A failed attempt's registrations go with its PD.
	return cm.QPOptions{Cap: qpCap, Prepare: func(c *cm.Conn) error { return e.prepare(c, client) },
		Release: func(*cm.Conn) { e.close() }}
}

// errDisconnected ends a run when the peer disconnects.
var errDisconnected = errors.New("rping: disconnected")

// wait returns the next completion of the wanted opcode, polling both CQs;
// it fails on an error completion, on disconnection or when ctx ends.
func (e *endpoint) wait(ctx context.Context, want roce.WCOpcode) (roce.WorkCompletion, error) {
	scq, rcq := e.conn.SendCQ(), e.conn.RecvCQ()
	for {
		for _, cq := range []*roce.CQ{rcq, scq} {
			for cq.Poll(e.wc[:1]) == 1 {
				wc := e.wc[0]
				if wc.Status != roce.WCSuccess {
					if wc.Status == roce.WCWRFlushErr {
						return wc, errDisconnected
					}
					return wc, fmt.Errorf("rping: cq completion failed status %d", wc.Status)
				}
				if wc.Opcode == want {
					return wc, nil
				}
				// SEND completions are not waited for, like rping.
			}
		}
		select {
		case <-ctx.Done():
			return roce.WorkCompletion{}, ctx.Err()
		case <-e.conn.Done():
			return roce.WorkCompletion{}, errDisconnected
		case <-rcq.Ready():
		case <-scq.Ready():
		}
	}
}

func (e *endpoint) recvInfo(ctx context.Context) (addr uint64, rkey, size uint32, err error) {
	wc, err := e.wait(ctx, roce.WCRecv)
	if err != nil {
		return 0, 0, 0, err
	}
	if wc.ByteLen != infoSize {
		return 0, 0, 0, fmt.Errorf("%w: received bogus data, size %d", ErrProtocol, wc.ByteLen)
	}
	addr = binary.BigEndian.Uint64(e.recvBuf)
	rkey = binary.BigEndian.Uint32(e.recvBuf[8:])
	size = binary.BigEndian.Uint32(e.recvBuf[12:])
	return addr, rkey, size, e.postRecv()
}

func (e *endpoint) sendInfo(mr *roce.MR) error {
	if mr != nil {
		binary.BigEndian.PutUint64(e.sendBuf, mr.Addr())
		binary.BigEndian.PutUint32(e.sendBuf[8:], mr.RKey())
		binary.BigEndian.PutUint32(e.sendBuf[12:], uint32(e.cfg.Size))
	}
	return e.conn.QP().PostSend(&roce.SendWR{ID: 2, Opcode: roce.WRSend, Flags: roce.SendSignaled,
		SGL: []roce.SGE{e.sendMR.SGE(0, infoSize)}})
}

// connect dials raddr in tries of cfg.ConnectAttempt until one connects,
// the peer rejects, ctx ends or cfg.ConnectTimeout passes
// (ErrConnectTimeout).
func (e *endpoint) connect(ctx context.Context, dev *roce.Device, raddr netip.AddrPort) (*cm.Conn, error) {
	start := time.Now()
	step, cancel := context.WithTimeout(ctx, e.cfg.ConnectTimeout)
	defer cancel()
	for tries := 1; ; tries++ {
		try, cancelTry := context.WithTimeout(step, e.cfg.ConnectAttempt)
		conn, err := cm.Dial(try, dev, raddr, cm.DialOptions{QP: qpOptions(e, true),
			ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7})
		tryExpired := try.Err() != nil
		cancelTry()
		switch {
		case err == nil:
			return conn, nil
		case ctx.Err() != nil:
			return nil, err
		case step.Err() != nil:
			return nil, fmt.Errorf("%w: no connection to %v within %v (%d tries): %v",
				ErrConnectTimeout, raddr, time.Since(start).Round(time.Millisecond), tries, err)
		case !tryExpired:
			return nil, err // rejected, unreachable: trying again changes nothing
		}
	}
}

// Client runs rping -c against the server at raddr.
func Client(ctx context.Context, dev *roce.Device, raddr netip.AddrPort, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	e := &endpoint{cfg: cfg}
	defer e.close()
	conn, err := e.connect(ctx, dev, raddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	err = e.client(ctx)
	if errors.Is(err, errDisconnected) {
		fmt.Fprintln(cfg.Out, "client DISCONNECT EVENT...")
		return nil
	}
	dctx, cancel := context.WithTimeout(context.Background(), cm.ConvertToDuration(20))
	defer cancel()
	_ = conn.Disconnect(dctx)
	return err
}

func (e *endpoint) client(ctx context.Context) error {
	start := byte(65)
	for ping := 0; e.cfg.Count == 0 || ping < e.cfg.Count; ping++ {
		// "rdma-ping-N: " followed by a rotating run of 'A'..'z', NUL-terminated.
		n := copy(e.start, "rdma-ping-"+strconv.Itoa(ping)+": ")
		for i, c := n, start; i < len(e.start); i++ {
			e.start[i] = c
			if c++; c > 122 {
				c = 65
			}
		}
		if start++; start > 122 {
			start = 65
		}
		e.start[len(e.start)-1] = 0
		if err := e.sendInfo(e.startMR); err != nil {
			return err
		}
		if err := e.goAhead(ctx); err != nil {
			return err
		}
		if err := e.sendInfo(e.rdmaMR); err != nil {
			return err
		}
		if err := e.goAhead(ctx); err != nil {
			return err
		}
		if e.cfg.Validate && !bytes.Equal(e.start, e.rdma) {
			return ErrMismatch
		}
		if e.cfg.Verbose {
			fmt.Fprintf(e.cfg.Out, "ping data: %s\n", cstring(e.rdma))
		}
	}
	return nil
}

// goAhead waits for the server's 16-byte go-ahead SEND.
func (e *endpoint) goAhead(ctx context.Context) error {
	wc, err := e.wait(ctx, roce.WCRecv)
	if err != nil {
		return err
	}
	if wc.ByteLen != infoSize {
		return fmt.Errorf("%w: received bogus data, size %d", ErrProtocol, wc.ByteLen)
	}
	return e.postRecv()
}

// Server runs rping -s: it accepts one connection on laddr and serves
// pings until the client disconnects.
func Server(ctx context.Context, dev *roce.Device, laddr netip.AddrPort, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	// Every handshake the listener answers gets its own endpoint: under a
	// flood of requests that never complete, many are half-open at once,
	// and each releases its registrations when the listener drops it.
	var mu sync.Mutex
	eps := map[*cm.Conn]*endpoint{}
	opts := cm.QPOptions{Cap: qpCap,
		Prepare: func(c *cm.Conn) error {
			e := &endpoint{cfg: cfg}
			mu.Lock()
			eps[c] = e
			mu.Unlock()
			return e.prepare(c, false)
		},
		Release: func(c *cm.Conn) {
			mu.Lock()
			e := eps[c]
			delete(eps, c)
			mu.Unlock()
			if e != nil {
				e.close()
			}
		}}
	l, err := cm.Listen(ctx, dev, laddr, cm.ListenOptions{QP: opts,
		ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7, Backlog: 3})
	if err != nil {
		return err
	}
	conn, err := l.Accept(ctx)
	l.Close()
	if err != nil {
		return err
	}
	defer conn.Close()
	mu.Lock()
	e := eps[conn]
	mu.Unlock()
	if e == nil {
		return fmt.Errorf("%w: accepted a connection that was not prepared", ErrProtocol)
	}
	err = e.server(ctx)
	if errors.Is(err, errDisconnected) {
		fmt.Fprintln(cfg.Out, "server DISCONNECT EVENT...")
		return nil
	}
	dctx, cancel := context.WithTimeout(context.Background(), cm.ConvertToDuration(20))
	defer cancel()
	_ = conn.Disconnect(dctx)
	return err
}

func (e *endpoint) server(ctx context.Context) error {
	qp := e.conn.QP()
	for {
		addr, rkey, size, err := e.recvInfo(ctx)
		if err != nil {
			return err
		}
		if int(size) > len(e.rdma) {
			return fmt.Errorf("%w: peer buffer of %d bytes, ours %d", ErrProtocol, size, len(e.rdma))
		}
		if err := qp.PostSend(&roce.SendWR{ID: 3, Opcode: roce.WRRDMARead, Flags: roce.SendSignaled,
			SGL: []roce.SGE{e.rdmaMR.SGE(0, int(size))}, RemoteAddr: addr, RKey: rkey}); err != nil {
			return err
		}
		if _, err := e.wait(ctx, roce.WCRDMARead); err != nil {
			return err
		}
		if e.cfg.Verbose {
			fmt.Fprintf(e.cfg.Out, "server ping data: %s\n", cstring(e.rdma))
		}
		if err := e.sendInfo(nil); err != nil {
			return err
		}
		if addr, rkey, _, err = e.recvInfo(ctx); err != nil {
			return err
		}
		n := len(cstring(e.rdma)) + 1
		if err := qp.PostSend(&roce.SendWR{ID: 4, Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
			SGL: []roce.SGE{e.rdmaMR.SGE(0, min(n, len(e.rdma)))}, RemoteAddr: addr, RKey: rkey}); err != nil {
			return err
		}
		if _, err := e.wait(ctx, roce.WCRDMAWrite); err != nil {
			return err
		}
		if err := e.sendInfo(nil); err != nil {
			return err
		}
	}
}

// cstring returns b up to its first NUL.
func cstring(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
