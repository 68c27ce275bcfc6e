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
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/valyala/fasthttp"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3rdma"
)

// chunkSize is the most one RDMA transfer of a request moves: the
// buffer a request holds, whatever the object's size.
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

func (r *run) end() {
	_ = r.b.rdma.DeregisterBuffer(r.reg)
	r.buf = nil
	r.release()
	r.b.rdma.FreeChannel(r.ch)
}

// transfer moves n bytes between the buffer's start and the client's
// region at off.
func (r *run) transfer(ctx context.Context, key string, off, n uint64, put bool) error {
	req := &cuobj.Request{Key: key, Local: r.reg, RemoteAddr: r.tok.Addr + off, Size: n, Token: r.raw, Channel: r.ch}
	var err error
	if put {
		_, err = r.b.rdma.HandlePutObject(ctx, req)
	} else {
		_, err = r.b.rdma.HandleGetObject(ctx, req)
	}
	return err
}

// readBody admits an RDMA PUT or UploadPart and returns its body: a pipe
// that RDMA READs fill chunk by chunk as the backend consumes it. wait
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
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		var err error
		for off := int64(0); off < n && err == nil; {
			c := min(n-off, int64(len(r.buf)))
			if err = r.transfer(ctx, key, uint64(off), uint64(c), true); err == nil {
				_, err = pw.Write(r.buf[:c])
				off += c
			}
		}
		pw.CloseWithError(err) // nil: io.EOF
		done <- err
	}()
	wait = func() error {
		pr.Close() // a backend that stopped reading unblocks the writer
		err := <-done
		r.end()
		cancel()
		if err != nil && !errors.Is(err, io.ErrClosedPipe) {
			return b.rdmaError(rctx, key, err)
		}
		return nil
	}
	return pr, n, wait, nil
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
		defer r.end()
		for off := int64(0); off < n; {
			c := min(n-off, int64(len(r.buf)))
			if _, err := io.ReadFull(res.Body, r.buf[:c]); err != nil {
				return nil, apiErr(http.StatusInternalServerError, "InternalError", err.Error())
			}
			if err := r.transfer(tctx, key, uint64(off), uint64(c), false); err != nil {
				return nil, b.rdmaError(rctx, key, err)
			}
			off += c
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

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

var _ backend.Backend = (*rdmaBackend)(nil)
