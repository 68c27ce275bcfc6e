package s3gw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/valyala/fasthttp"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3rdma"
	"github.com/goroce/goroce/roce"
)

// chunkSize is the buffer a request holds, whatever the object's size:
// the most its pieces in flight move at once.
const chunkSize = 16 << 20

// Error codes of the protocol beyond S3's.
const (
	errInvalidToken   = "InvalidRDMAToken"
	errTransferFailed = "RDMATransferFailed"
)

// rdmaBackend is the posix backend with the bodies of PutObject,
// UploadPart and GetObject moved by RDMA when the request has a token.
// Everything else passes through.
type rdmaBackend struct {
	backend.Backend
	rdma        *cuobj.Server
	max         int64
	log         *slog.Logger
	bodyTimeout time.Duration
	stats       Stats
	// base bounds every RDMA transfer: Gateway.Close cancels it. (Not the
	// fasthttp.RequestCtx: its Done races with the server's shutdown.)
	base context.Context
	idle bufPool
}

// idleBuffers is how many registered buffers of chunkSize the gateway
// keeps between requests. Allocating (and so zeroing and faulting in) a
// request's 16 MiB afresh, and registering it, cost as much CPU as the
// file's read for a 16 MiB GET; the few kept idle are memory beside the
// budget (Tunables.MaxHeldBytes), which counts the buffers in use.
const idleBuffers = 2

// hostBuf is a registered buffer.
type hostBuf struct {
	buf []byte
	reg *cuobj.Buffer
}

// bufPool holds up to idleBuffers registered buffers of chunkSize.
type bufPool struct {
	mu     sync.Mutex
	bufs   []hostBuf
	closed bool
}

func (p *bufPool) get() (hostBuf, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bufs) == 0 {
		return hostBuf{}, false
	}
	hb := p.bufs[len(p.bufs)-1]
	p.bufs = p.bufs[:len(p.bufs)-1]
	return hb, true
}

// put keeps hb, or says to deregister it: the pool is full or closed.
func (p *bufPool) put(hb hostBuf) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.bufs) == idleBuffers {
		return false
	}
	p.bufs = append(p.bufs, hb)
	return true
}

// close empties the pool for good and returns what it held.
func (p *bufPool) close() []hostBuf {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	bufs := p.bufs
	p.bufs = nil
	return bufs
}

// shutdown deregisters the idle buffers: the cuobj.Server outlives the
// gateway.
func (b *rdmaBackend) shutdown() {
	for _, hb := range b.idle.close() {
		_ = b.rdma.DeregisterBuffer(hb.reg)
	}
}

func apiErr(status int, code, msg string) s3err.APIError {
	return s3err.APIError{Code: code, Description: msg, HTTPStatusCode: status}
}

// token returns the request's RDMA token: ok false without one, an error
// when RDMA is off (501) or the token is invalid (400).
func (b *rdmaBackend) token(ctx context.Context) (rctx *fasthttp.RequestCtx, tok cuobj.Token, raw string, ok bool, err error) {
	rctx, isReq := ctx.(*fasthttp.RequestCtx)
	if !isReq {
		return nil, tok, "", false, nil
	}
	raw = string(rctx.Request.Header.Peek(s3rdma.HeaderToken))
	if raw == "" {
		return rctx, tok, "", false, nil
	}
	if b.rdma == nil {
		b.stats.Declined.Add(1)
		return rctx, tok, raw, true, apiErr(http.StatusNotImplemented, "NotImplemented", "RDMA is not enabled on this server")
	}
	tok, err = cuobj.ParseToken(raw)
	if err != nil {
		return rctx, tok, raw, true, apiErr(http.StatusBadRequest, errInvalidToken, err.Error())
	}
	return rctx, tok, raw, true, nil
}

// peerOf returns the HTTP peer's address: the client whose channels
// AllocateChannelFor counts.
func peerOf(rctx *fasthttp.RequestCtx) netip.Addr {
	a, _ := netip.AddrFromSlice(rctx.RemoteIP())
	return a.Unmap()
}

// rdmaError answers a failure of the RDMA path: admission refusals
// (cuobj.ErrOverloaded) are 503 SlowDown with Retry-After, a client that
// did not answer 504, anything else 500.
func (b *rdmaBackend) rdmaError(rctx *fasthttp.RequestCtx, key string, err error) error {
	var oe *cuobj.OverloadError
	switch {
	case errors.As(err, &oe):
		b.stats.Overloaded.Add(1)
		rctx.Response.Header.Set("Retry-After", strconv.Itoa(max(1, int((oe.RetryAfter+time.Second-1)/time.Second))))
		return apiErr(http.StatusServiceUnavailable, "SlowDown", err.Error())
	case errors.Is(err, cuobj.ErrConnectTimeout):
		b.stats.ConnectTimeouts.Add(1)
		return apiErr(http.StatusGatewayTimeout, errTransferFailed, err.Error())
	default:
		b.log.Error("RDMA request failed", "key", key, "err", err)
		return apiErr(http.StatusInternalServerError, errTransferFailed, err.Error())
	}
}

// run is one admitted RDMA request: its channel and buffer.
type run struct {
	b       *rdmaBackend
	ch      uint16
	buf     []byte
	reg     *cuobj.Buffer
	release func()
	tok     cuobj.Token
	raw     string
	req     cuobj.Request // the piece being posted (the server keeps no pointer to it)
}

// start admits an RDMA request of n bytes: a channel (counted to the HTTP
// peer), the connection to the client the token names, and only then the
// budget and a buffer of at most chunkSize bytes, so that a token naming
// a client that does not answer costs no memory and a channel for at
// most the connect timeout.
func (b *rdmaBackend) start(ctx context.Context, rctx *fasthttp.RequestCtx, key string, tok cuobj.Token, raw string, n int64) (*run, error) {
	ch, err := b.rdma.AllocateChannelFor(peerOf(rctx))
	if err != nil {
		return nil, b.rdmaError(rctx, key, err)
	}
	if err := b.rdma.Connect(ctx, ch, raw); err != nil {
		b.rdma.FreeChannel(ch)
		return nil, b.rdmaError(rctx, key, err)
	}
	size := int(min(n, chunkSize))
	release, err := b.rdma.Reserve(int64(size))
	if err != nil {
		b.rdma.FreeChannel(ch)
		return nil, b.rdmaError(rctx, key, err)
	}
	if size == chunkSize {
		if hb, ok := b.idle.get(); ok {
			return &run{b: b, ch: ch, buf: hb.buf, reg: hb.reg, release: release, tok: tok, raw: raw}, nil
		}
	}
	buf, err := b.rdma.AllocHostBuffer(size)
	if err == nil {
		var reg *cuobj.Buffer
		if reg, err = b.rdma.RegisterBuffer(buf); err == nil {
			return &run{b: b, ch: ch, buf: buf, reg: reg, release: release, tok: tok, raw: raw}, nil
		}
	}
	release()
	b.rdma.FreeChannel(ch)
	return nil, apiErr(http.StatusInternalServerError, "InternalError", err.Error())
}

// end ends the request. Its buffer is kept for the next one only when
// clean: every transfer into it completed (a failed one may have left
// pieces in flight that drain gave up on).
func (r *run) end(clean bool) {
	if !clean || len(r.buf) != chunkSize || !r.b.idle.put(hostBuf{r.buf, r.reg}) {
		_ = r.b.rdma.DeregisterBuffer(r.reg)
	}
	r.buf = nil
	r.release()
	r.b.rdma.FreeChannel(r.ch)
}

// pieceSize is what one RDMA READ or WRITE of a request moves. A request
// keeps the pieces of its buffer in flight at once (as perftest keeps
// many messages outstanding) and overlaps them with the file's I/O: one
// transfer of the whole buffer at a time left the link idle while the
// file was written or read, and the file idle while the link worked.
const pieceSize = 1 << 20

// drainTimeout bounds waiting, after a failure, for the pieces still in
// flight: they complete or are flushed well before, unless the client
// stopped answering (then the retries of the transport run out).
const drainTimeout = 10 * time.Second

// errStopped ends a PUT's transfers when the backend stopped reading.
var errStopped = errors.New("s3gw: the backend stopped reading the body")

// slots is the number of pieces the buffer holds.
func (r *run) slots() int { return (len(r.buf) + pieceSize - 1) / pieceSize }

// slot returns piece i of the buffer.
func (r *run) slot(i int) []byte {
	lo := i * pieceSize
	return r.buf[lo:min(lo+pieceSize, len(r.buf))]
}

// post submits the transfer of c bytes between slot and the client's
// region at off, asynchronously: the slot's number identifies its
// completion (a small integer: no allocation to box it).
func (r *run) post(ctx context.Context, key string, slot int, off int64, c int, put bool) error {
	r.req = cuobj.Request{Key: key, Local: r.reg, LocalOffset: uint64(slot * pieceSize), RemoteAddr: r.tok.Addr + uint64(off),
		Size: uint64(c), Token: r.raw, Channel: r.ch, Async: slot}
	var err error
	if put {
		_, err = r.b.rdma.HandlePutObject(ctx, &r.req)
	} else {
		_, err = r.b.rdma.HandleGetObject(ctx, &r.req)
	}
	return err
}

// reap waits for at least one completion and returns the slots whose
// transfers completed.
func (r *run) reap(ctx context.Context, ev []cuobj.AsyncEvent, slots []int) ([]int, error) {
	slots = slots[:0]
	for len(slots) == 0 {
		n, err := r.b.rdma.PollWait(ctx, r.ch, ev)
		for _, e := range ev[:n] {
			if e.Status == roce.WCSuccess {
				slots = append(slots, e.Handle.(int))
			}
		}
		if err != nil {
			return slots, err
		}
		if n == 0 {
			return slots, errors.New("s3gw: no transfer in flight to wait for")
		}
	}
	return slots, nil
}

// drain waits, after a failure, for the pieces still in flight (or
// flushed by the reset a failed completion brings), so that the buffer is
// deregistered only once nothing targets it.
func (r *run) drain(ev []cuobj.AsyncEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	for {
		if n, _ := r.b.rdma.PollWait(ctx, r.ch, ev); n == 0 {
			return // nothing outstanding, or given up on
		}
	}
}

// piece is a filled slot of a PUT: n bytes, handed to the body's reader.
type piece struct{ slot, n int }

// readPieces moves an RDMA PUT's n bytes into the buffer piece by piece,
// every free slot in flight, and hands the filled ones to filled in the
// object's order; the reader gives slots back on free.
func (r *run) readPieces(ctx context.Context, key string, n int64, filled chan<- piece, free <-chan int, stop <-chan struct{}) (err error) {
	ns := r.slots()
	idle := make([]int, 0, ns)
	for i := range ns {
		idle = append(idle, ns-1-i) // the last slot, maybe short, last
	}
	ev := make([]cuobj.AsyncEvent, cuobj.MaxPollEvents)
	slots := make([]int, 0, len(ev))
	// The pieces posted and not yet handed on are next-emit ≤ ns: their
	// slots in the object's order (order[seq%ns]), sizes and completion.
	order, size, done := make([]int, ns), make([]int, ns), make([]bool, ns)
	next, emit := 0, 0 // sequence numbers: next to post, next to hand on
	var off, emitted int64
	defer func() {
		if err != nil {
			r.drain(ev)
		}
	}()
	for emitted < n {
		for len(idle) > 0 && off < n {
			slot := idle[len(idle)-1]
			c := int(min(n-off, int64(len(r.slot(slot)))))
			if err := r.post(ctx, key, slot, off, c, true); err != nil {
				return err
			}
			idle = idle[:len(idle)-1]
			order[next%ns], size[slot] = slot, c
			next++
			off += int64(c)
		}
		if inflight := next - emit; inflight > 0 && !done[order[emit%ns]] {
			if slots, err = r.reap(ctx, ev, slots); err != nil {
				return err
			}
			for _, s := range slots {
				done[s] = true
			}
		}
		for emit < next && done[order[emit%ns]] {
			// RC and DC complete one channel's requests in order; this
			// keeps the object's order even if not.
			slot := order[emit%ns]
			done[slot] = false
			filled <- piece{slot, size[slot]} // never blocks: it holds every slot
			emitted += int64(size[slot])
			emit++
		}
		if emitted == n {
			break
		}
		if emit == next {
			// Nothing in flight: wait for the reader to give a slot back.
			select {
			case s := <-free:
				idle = append(idle, s)
			case <-stop:
				return errStopped
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		// Slots the reader gave back meanwhile.
		for more := true; more; {
			select {
			case s := <-free:
				idle = append(idle, s)
			default:
				more = false
			}
		}
	}
	return nil
}

// rdmaBody is an RDMA PUT's body: the pieces readPieces fills, in order.
type rdmaBody struct {
	r      *run
	filled <-chan piece
	free   chan<- int
	cur    []byte
	slot   int // of cur; -1: none held
	err    *error
}

func (b *rdmaBody) Read(p []byte) (int, error) {
	for len(b.cur) == 0 {
		if b.slot >= 0 {
			b.free <- b.slot // never blocks: it holds every slot
			b.slot = -1
		}
		pc, ok := <-b.filled
		if !ok {
			if *b.err != nil {
				return 0, *b.err
			}
			return 0, io.EOF
		}
		b.cur, b.slot = b.r.slot(pc.slot)[:pc.n], pc.slot
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

// readBody admits an RDMA PUT or UploadPart and returns its body, which
// RDMA READs fill piece by piece ahead of the backend's reading. wait
// ends the request and returns the transfer's error, if any.
func (b *rdmaBackend) readBody(rctx *fasthttp.RequestCtx, key string, tok cuobj.Token, raw string) (body io.Reader, n int64, wait func() error, err error) {
	if rctx.Request.Header.ContentLength() > 0 {
		return nil, 0, nil, apiErr(http.StatusBadRequest, "InvalidRequest", "an RDMA PUT has no body")
	}
	n = int64(tok.Size)
	switch {
	case n > b.max:
		return nil, 0, nil, apiErr(http.StatusBadRequest, "EntityTooLarge", fmt.Sprintf("%d bytes, at most %d", n, b.max))
	case n == 0:
		return nil, 0, nil, apiErr(http.StatusBadRequest, "InvalidRequest", "an empty object goes by plain HTTP")
	}
	ctx, cancel := context.WithTimeout(b.base, b.bodyTimeout)
	r, err := b.start(ctx, rctx, key, tok, raw, n)
	if err != nil {
		cancel()
		return nil, 0, nil, err
	}
	filled, free, stop := make(chan piece, r.slots()), make(chan int, r.slots()), make(chan struct{})
	done := make(chan error, 1)
	var perr error
	go func() {
		err := r.readPieces(ctx, key, n, filled, free, stop)
		perr = err // before the close: the reader looks at it then
		close(filled)
		done <- err
	}()
	wait = func() error {
		close(stop) // a backend that stopped reading unblocks the transfers
		err := <-done
		r.end(err == nil)
		cancel()
		if err != nil && !errors.Is(err, errStopped) {
			return b.rdmaError(rctx, key, err)
		}
		return nil
	}
	return &rdmaBody{r: r, filled: filled, free: free, slot: -1, err: &perr}, n, wait, nil
}

func (b *rdmaBackend) PutObject(ctx context.Context, po s3response.PutObjectInput) (s3response.PutObjectOutput, error) {
	rctx, tok, raw, ok, err := b.token(ctx)
	if err != nil {
		return s3response.PutObjectOutput{}, err
	}
	if !ok {
		b.stats.PlainPuts.Add(1)
		return b.Backend.PutObject(ctx, po)
	}
	key := deref(po.Key)
	body, n, wait, err := b.readBody(rctx, key, tok, raw)
	if err != nil {
		return s3response.PutObjectOutput{}, err
	}
	po.Body, po.ContentLength = body, &n
	out, err := b.Backend.PutObject(ctx, po)
	if werr := wait(); werr != nil {
		return s3response.PutObjectOutput{}, werr
	}
	if err != nil {
		return out, err
	}
	b.putDone(rctx, n)
	return out, nil
}

// putDone counts an RDMA PUT or part of n bytes and says so in the reply.
func (b *rdmaBackend) putDone(rctx *fasthttp.RequestCtx, n int64) {
	b.stats.RDMAPuts.Add(1)
	b.stats.RDMABytes.Add(uint64(n))
	rctx.Response.Header.Set(s3rdma.HeaderReply, strconv.Itoa(http.StatusOK))
}

func (b *rdmaBackend) UploadPart(ctx context.Context, in *s3.UploadPartInput) (*s3.UploadPartOutput, error) {
	rctx, tok, raw, ok, err := b.token(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return b.Backend.UploadPart(ctx, in)
	}
	key := deref(in.Key)
	body, n, wait, err := b.readBody(rctx, key, tok, raw)
	if err != nil {
		return nil, err
	}
	part := *in
	part.Body, part.ContentLength = body, &n
	out, err := b.Backend.UploadPart(ctx, &part)
	if werr := wait(); werr != nil {
		return nil, werr
	}
	if err != nil {
		return out, err
	}
	b.putDone(rctx, n)
	return out, nil
}

func (b *rdmaBackend) GetObject(ctx context.Context, in *s3.GetObjectInput) (*s3.GetObjectOutput, error) {
	rctx, tok, raw, ok, err := b.token(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		b.stats.PlainGets.Add(1)
		return b.Backend.GetObject(ctx, in)
	}
	// The backend opens the object and reads nothing yet: the file is
	// read once the client is reached.
	res, err := b.Backend.GetObject(ctx, in)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	length := int64(0)
	if res.ContentLength != nil {
		length = *res.ContentLength
	}
	n := min(length, int64(tok.Size), b.max)
	reply := http.StatusOK
	if (res.ContentRange != nil && *res.ContentRange != "") || n < length {
		reply = http.StatusPartialContent
	}
	if n == 0 {
		reply = http.StatusNoContent
	} else {
		key := deref(in.Key)
		tctx, cancel := context.WithTimeout(b.base, b.bodyTimeout)
		defer cancel()
		r, err := b.start(tctx, rctx, key, tok, raw, n)
		if err != nil {
			return nil, err
		}
		err = r.writePieces(tctx, key, n, res.Body)
		r.end(err == nil)
		if err != nil {
			var ae s3err.APIError
			if errors.As(err, &ae) {
				return nil, err
			}
			return nil, b.rdmaError(rctx, key, err)
		}
		b.stats.RDMAGets.Add(1)
		b.stats.RDMABytes.Add(uint64(n))
	}
	rctx.Response.Header.Set(s3rdma.HeaderReply, strconv.Itoa(reply))
	rctx.Response.Header.Set(s3rdma.HeaderBytes, strconv.FormatInt(n, 10))
	// The data went by RDMA: the answer has headers only.
	zero := int64(0)
	res.Body, res.ContentLength = io.NopCloser(bytes.NewReader(nil)), &zero
	return res, nil
}

// writePieces reads an RDMA GET's n bytes from body into the buffer piece
// by piece and posts each one's RDMA WRITE at once, reading the next
// while the link carries the ones before; it returns when all completed.
func (r *run) writePieces(ctx context.Context, key string, n int64, body io.Reader) (err error) {
	ns := r.slots()
	idle := make([]int, 0, ns)
	for i := range ns {
		idle = append(idle, ns-1-i) // the last slot, maybe short, last
	}
	ev := make([]cuobj.AsyncEvent, cuobj.MaxPollEvents)
	slots := make([]int, 0, len(ev))
	defer func() {
		if err != nil {
			r.drain(ev)
		}
	}()
	for off := int64(0); off < n || len(idle) < ns; {
		if len(idle) > 0 && off < n {
			slot := idle[len(idle)-1]
			c := int(min(n-off, int64(len(r.slot(slot)))))
			if _, err := io.ReadFull(body, r.slot(slot)[:c]); err != nil {
				return apiErr(http.StatusInternalServerError, "InternalError", err.Error())
			}
			if err := r.post(ctx, key, slot, off, c, false); err != nil {
				return err
			}
			idle = idle[:len(idle)-1]
			off += int64(c)
			continue
		}
		if slots, err = r.reap(ctx, ev, slots); err != nil {
			return err
		}
		idle = append(idle, slots...)
	}
	return nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

var _ backend.Backend = (*rdmaBackend)(nil)
