package s3gw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/s3api"
	"github.com/versity/versitygw/s3api/middlewares"
	"github.com/versity/versitygw/s3api/utils"
	"github.com/versity/versitygw/s3err"

	"github.com/goroce/goroce/cuobj"
)

// Defaults of Options.
const (
	DefaultMaxObjectSize  = 1 << 30
	DefaultHeaderTimeout  = 30 * time.Second
	DefaultBodyTimeout    = 10 * time.Minute
	DefaultIdleTimeout    = 60 * time.Second
	DefaultMaxConnections = 1024
	DefaultMaxRequests    = 512
	DefaultRegion         = "us-east-1"
)

// Options configure New.
type Options struct {
	// Dir holds the objects: Dir/BUCKET/KEY. Required.
	Dir string
	// RDMA moves the bodies of requests with an x-amz-rdma-token; nil
	// declines them with 501 NotImplemented.
	RDMA *cuobj.Server
	// AccessKey and SecretKey are the one account's credentials: every
	// request must be signed with them (SigV4). Required.
	AccessKey, SecretKey string
	// Region is the region requests are signed for (DefaultRegion).
	Region string
	// MaxObjectSize bounds an RDMA PUT (larger: 400 EntityTooLarge) and
	// what one RDMA GET moves (larger objects: 206 with their start).
	MaxObjectSize int64
	// HeaderTimeout bounds reading a request's header, BodyTimeout its
	// body, IdleTimeout the wait for the next request on a kept-alive
	// connection: a client slower than that is cut.
	HeaderTimeout, BodyTimeout, IdleTimeout time.Duration
	// MaxConnections and MaxRequests bound the open connections and the
	// requests served at once (more requests: 503 SlowDown).
	MaxConnections, MaxRequests int
	// SideCarDir, when set, keeps object metadata in files there instead
	// of in extended attributes of the objects (for file systems without
	// user xattrs). It must lie outside Dir.
	SideCarDir string
	// Logger logs failed RDMA transfers (default: none).
	Logger *slog.Logger
}

// Gateway is an S3 server (versitygw over a directory) that moves object
// bodies by RDMA when a request carries a token.
type Gateway struct {
	srv  *s3api.S3ApiServer
	app  *fiber.App
	be   *rdmaBackend
	wd   string // the working directory before New: the posix backend changes it
	stop context.CancelFunc
	once sync.Once
	// fresh holds the connections that have not yet sent a byte.
	// fasthttp's shutdown counts such a connection as busy for its
	// first 5 s (a client's transport may open one it never uses), past
	// Close's grace, so Close closes them itself.
	fresh freshConns
}

// freshConns tracks the accepted connections that have not yet sent a
// byte. (fasthttp's StateActive cannot tell: it fires before the first
// read.)
type freshConns struct {
	mu sync.Mutex
	m  map[*countedConn]struct{}
}

// countedConn notes its first byte read. Embedding the TCP connection
// keeps its ReadFrom, which fasthttp's sendfile path uses.
type countedConn struct {
	*net.TCPConn
	used atomic.Bool
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	if n > 0 && !c.used.Load() {
		c.used.Store(true)
	}
	return n, err
}

// trackingListener counts the TCP connections it accepts in fresh.
type trackingListener struct {
	net.Listener
	fresh *freshConns
}

func (l trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	tc, ok := c.(*net.TCPConn)
	if err != nil || !ok {
		return c, err
	}
	cc := &countedConn{TCPConn: tc}
	l.fresh.mu.Lock()
	if l.fresh.m == nil {
		l.fresh.m = make(map[*countedConn]struct{})
	}
	l.fresh.m[cc] = struct{}{}
	l.fresh.mu.Unlock()
	return cc, nil
}

// state forgets a connection once fasthttp has closed it.
func (f *freshConns) state(c net.Conn, s fasthttp.ConnState) {
	cc, ok := c.(*countedConn)
	if !ok || s != fasthttp.StateClosed && s != fasthttp.StateHijacked {
		return
	}
	f.mu.Lock()
	delete(f.m, cc)
	f.mu.Unlock()
}

// closeUnused closes every connection that has not sent a byte.
func (f *freshConns) closeUnused() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.m {
		if !c.used.Load() {
			_ = c.Close()
			delete(f.m, c)
		}
	}
}

// unused counts the connections that have not sent a byte.
func (f *freshConns) unused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for c := range f.m {
		if !c.used.Load() {
			n++
		}
	}
	return n
}

// Stats counts what the gateway did.
type Stats struct {
	RDMAGets, RDMAPuts, PlainGets, PlainPuts atomic.Uint64
	// Declined counts RDMA requests answered 501 (no RDMA server).
	Declined  atomic.Uint64
	RDMABytes atomic.Uint64
	// Overloaded counts RDMA requests refused by an admission limit of the
	// cuobj.Server (503 SlowDown); ConnectTimeouts those whose client did
	// not answer in time (504).
	Overloaded, ConnectTimeouts atomic.Uint64
}

// New makes a gateway over o.Dir. The posix backend works relative to
// the process's working directory, which it sets to o.Dir; Close sets it
// back. So only one Gateway may be open in a process at a time.
func New(o Options) (*Gateway, error) {
	if o.AccessKey == "" || o.SecretKey == "" {
		return nil, errors.New("s3gw: an access key and a secret key are required")
	}
	st, err := os.Stat(o.Dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("s3gw: %s is not a directory", o.Dir)
	}
	o.fill()
	var ms meta.MetadataStorer = meta.XattrMeta{}
	if o.SideCarDir != "" {
		// Absolute: the posix backend changes the working directory.
		if o.SideCarDir, err = filepath.Abs(o.SideCarDir); err != nil {
			return nil, err
		}
		sc, err := meta.NewSideCar(o.SideCarDir)
		if err != nil {
			return nil, fmt.Errorf("s3gw: sidecar: %w", err)
		}
		ms = sc
	} else if err := (meta.XattrMeta{}).Test(o.Dir); err != nil {
		return nil, fmt.Errorf("s3gw: %s keeps no extended attributes (%v): give a sidecar directory", o.Dir, err)
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root, err := filepath.Abs(o.Dir)
	if err == nil {
		root, err = filepath.EvalSymlinks(root)
	}
	if err != nil {
		return nil, err
	}
	px, err := posix.New(root, ms, posix.PosixOpts{NewDirPerm: 0o755, ValidateBucketNames: true,
		CopyObjectThreshold: 5 << 30, SideCarDir: o.SideCarDir})
	if err != nil {
		_ = os.Chdir(wd)
		return nil, fmt.Errorf("s3gw: %w", err)
	}
	base, stop := context.WithCancel(context.Background())
	be := &rdmaBackend{Backend: px, rdma: o.RDMA, max: o.MaxObjectSize, log: o.Logger, bodyTimeout: o.BodyTimeout, base: base}
	// One account: auth.New would choose the same, and say so on stdout.
	iam := auth.NewIAMServiceSingle(auth.Account{Access: o.AccessKey, Secret: o.SecretKey, Role: auth.RoleAdmin})
	opts := []s3api.Option{
		s3api.WithConcurrencyLimiter(o.MaxConnections, o.MaxRequests),
		s3api.WithMpMaxParts(10000),
		s3api.WithKeepAlive(),
		s3api.WithQuiet(),
		s3api.WithMiddleware("/", confine(root)),
	}
	srv, err := s3api.New(be, middlewares.RootUserConfig{Access: o.AccessKey, Secret: o.SecretKey}, o.Region, iam,
		nil, nil, nil, nil, opts...)
	if err != nil {
		stop()
		px.Shutdown()
		_ = os.Chdir(wd)
		return nil, fmt.Errorf("s3gw: %w", err)
	}
	app, err := fiberApp(srv)
	if err != nil {
		stop()
		px.Shutdown()
		_ = os.Chdir(wd)
		return nil, err
	}
	// versitygw has no option for fasthttp's timeouts (a client could
	// hold a connection forever by sending its header slowly): set them
	// on its server before it serves. The read deadline first covers the
	// header; once the header is in, HeaderReceived extends it for the
	// body.
	hs := app.Server()
	hs.ReadTimeout, hs.IdleTimeout = o.HeaderTimeout, o.IdleTimeout
	body := o.BodyTimeout
	hs.HeaderReceived = func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
		return fasthttp.RequestConfig{ReadTimeout: body}
	}
	g := &Gateway{srv: srv, app: app, be: be, wd: wd, stop: stop}
	hs.ConnState = g.fresh.state
	return g, nil
}

func (o *Options) fill() {
	if o.Region == "" {
		o.Region = DefaultRegion
	}
	if o.MaxObjectSize <= 0 {
		o.MaxObjectSize = DefaultMaxObjectSize
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = DefaultHeaderTimeout
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	if o.MaxRequests <= 0 {
		o.MaxRequests = min(DefaultMaxRequests, o.MaxConnections)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// confine refuses (403 AccessDenied) a request whose bucket, key or copy
// source leads through a symbolic link out of root: the posix backend
// follows links, which would serve and overwrite files outside the
// directory. Links that stay inside root are followed.
func confine(root string) fiber.Handler {
	return func(c fiber.Ctx) error {
		names := []string{string(c.Request().URI().Path())}
		if src := c.Get("X-Amz-Copy-Source"); src != "" {
			src, _, _ = strings.Cut(src, "?")
			if u, err := url.PathUnescape(src); err == nil {
				src = u
			}
			names = append(names, src)
		}
		for _, n := range names {
			if !inside(root, n) {
				rid, hid := utils.EnsureRequestIDs(c)
				e := s3err.GetAPIError(s3err.ErrAccessDenied)
				c.Response().Header.SetContentType(fiber.MIMEApplicationXML)
				return c.Status(e.HTTPStatusCode).Send(e.XMLBody(rid, hid))
			}
		}
		return c.Next()
	}
}

// inside reports whether the path-style name (/BUCKET/KEY) stays inside
// root, following the symbolic links among its existing components.
func inside(root, name string) bool {
	p := root
	for _, part := range strings.Split(strings.Trim(name, "/"), "/") {
		switch part {
		case "", ".":
			continue
		case "..":
			return false
		}
		p = filepath.Join(p, part)
		st, err := os.Lstat(p)
		if err != nil {
			return true // the rest does not exist: nothing to follow
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		r, err := filepath.EvalSymlinks(p)
		if err != nil || (r != root && !strings.HasPrefix(r, root+string(filepath.Separator))) {
			return false // dangling, or out of root
		}
	}
	return true
}

// fiberApp returns the fiber application of a versitygw server, which
// versitygw keeps unexported.
func fiberApp(srv *s3api.S3ApiServer) (*fiber.App, error) {
	f := reflect.ValueOf(srv).Elem().FieldByName("app")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*fiber.App]() {
		return nil, errors.New("s3gw: this versitygw has no fiber app where expected")
	}
	app := *(**fiber.App)(unsafe.Pointer(f.UnsafeAddr()))
	if app == nil || app.Server() == nil {
		return nil, errors.New("s3gw: versitygw's fiber app has no server")
	}
	return app, nil
}

// Serve answers S3 requests on ln until Close.
func (g *Gateway) Serve(ln net.Listener) error {
	return g.app.Listener(trackingListener{Listener: ln, fresh: &g.fresh}, fiber.ListenConfig{DisableStartupMessage: true})
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() *Stats { return &g.be.stats }

// Close stops serving (requests in flight get a few seconds), shuts the
// backend down and restores the working directory.
func (g *Gateway) Close() error {
	var err error
	g.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// The shutdown closes the listener at once; connections still
		// without a request are closed once it has (a little later,
		// for one accepted just before).
		go func() {
			select { // a request already on its way gets a moment
			case <-ctx.Done():
				return
			case <-time.After(300 * time.Millisecond):
			}
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				g.fresh.closeUnused()
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
		err = g.app.ShutdownWithContext(ctx)
		cancel()
		g.stop() // transfers still running after the grace period
		g.be.Shutdown()
		g.be.shutdown() // a transfer ending later deregisters its own
		if e := os.Chdir(g.wd); err == nil {
			err = e
		}
	})
	return err
}
