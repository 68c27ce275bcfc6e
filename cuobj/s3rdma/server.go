package s3rdma

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/cuobj"
)

// DefaultMaxObjectSize bounds what one RDMA request makes the server
// buffer in memory.
const DefaultMaxObjectSize = 1 << 30

// Server is an S3 server over a directory: DIR/BUCKET/KEY holds an object.
type Server struct {
	// MaxObjectSize bounds an RDMA PUT (the token's rsize) and the part of
	// an object one RDMA GET moves (default DefaultMaxObjectSize); larger
	// PUTs are refused with 400 EntityTooLarge, larger GETs answered 206
	// with their first MaxObjectSize bytes.
	MaxObjectSize int64

	dir  string
	rdma *cuobj.Server // nil: RDMA requests are declined with 501
	log  *slog.Logger

	// Counters.
	RDMAGets, RDMAPuts, PlainGets, PlainPuts, Declined atomic.Uint64
	RDMABytes                                          atomic.Uint64
	// Overloaded counts RDMA requests refused by an admission limit of the
	// cuobj.Server (503 SlowDown); ConnectTimeouts those whose client did
	// not answer in time (504).
	Overloaded, ConnectTimeouts atomic.Uint64
}

// NewServer serves the objects in dir; rdma may be nil.
func NewServer(dir string, rdma *cuobj.Server, log *slog.Logger) (*Server, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("s3rdma: %s is not a directory", dir)
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Server{dir: dir, rdma: rdma, log: log, MaxObjectSize: DefaultMaxObjectSize}, nil
}

type s3Error struct {
	XMLName xml.Name `xml:"Error"`
	Code    string   `xml:"Code"`
	Message string   `xml:"Message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	_ = xml.NewEncoder(w).Encode(s3Error{Code: code, Message: msg})
}

// split returns the bucket and key of a path-style URL, checked to stay
// inside the directory.
func split(p string) (bucket, key string, ok bool) {
	p = strings.TrimPrefix(p, "/")
	bucket, key, _ = strings.Cut(p, "/")
	if bucket == "" || !validName(bucket) {
		return "", "", false
	}
	if key != "" {
		for _, part := range strings.Split(key, "/") {
			if !validName(part) {
				return "", "", false
			}
		}
	}
	return bucket, key, true
}

func validName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "\x00\\") && !strings.HasPrefix(s, ".s3rdma-")
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	bucket, key, ok := split(r.URL.Path)
	if !ok {
		writeError(w, http.StatusBadRequest, "InvalidURI", "path-style /BUCKET/KEY expected")
		return
	}
	bdir := filepath.Join(s.dir, bucket)
	if key == "" {
		s.bucket(w, r, bucket, bdir)
		return
	}
	path := filepath.Join(bdir, filepath.FromSlash(key))
	tok := r.Header.Get(HeaderToken)
	switch r.Method {
	case http.MethodGet:
		if tok != "" {
			s.rdmaGet(w, r, path, tok)
			return
		}
		s.PlainGets.Add(1)
		f, err := os.Open(path)
		if err != nil {
			notFound(w, err)
			return
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || st.IsDir() {
			writeError(w, http.StatusNotFound, "NoSuchKey", key)
			return
		}
		w.Header().Set("ETag", etagOf(path))
		http.ServeContent(w, r, "", st.ModTime(), f)
	case http.MethodHead:
		st, err := os.Stat(path)
		if err != nil || st.IsDir() {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(st.Size(), 10))
		w.Header().Set("ETag", etagOf(path))
		w.Header().Set("Last-Modified", st.ModTime().UTC().Format(http.TimeFormat))
	case http.MethodPut:
		if _, err := os.Stat(bdir); err != nil {
			writeError(w, http.StatusNotFound, "NoSuchBucket", bucket)
			return
		}
		if tok != "" {
			s.rdmaPut(w, r, path, tok)
			return
		}
		s.PlainPuts.Add(1)
		sum, err := store(path, func(f *os.File) error { _, err := io.Copy(f, r.Body); return err })
		if err != nil {
			writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
			return
		}
		w.Header().Set("ETag", sum)
	case http.MethodDelete:
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method)
	}
}

func notFound(w http.ResponseWriter, err error) {
	if errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusNotFound, "NoSuchKey", "no such object")
		return
	}
	writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
}

// store writes an object atomically (a temporary file renamed into place)
// and returns its ETag (the MD5 of the data, quoted), which is kept beside it.
func store(path string, write func(*os.File) error) (string, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".s3rdma-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return "", err
	}
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", err
	}
	return `"` + hex.EncodeToString(h.Sum(nil)) + `"`, nil
}

func etagOf(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return `"` + hex.EncodeToString(h.Sum(nil)) + `"`
}

// bucket handles requests on a bucket: PUT creates it, GET lists it
// (ListObjectsV2), HEAD checks it.
func (s *Server) bucket(w http.ResponseWriter, r *http.Request, bucket, bdir string) {
	switch r.Method {
	case http.MethodPut:
		if err := os.MkdirAll(bdir, 0o755); err != nil {
			writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		}
	case http.MethodHead:
		if _, err := os.Stat(bdir); err != nil {
			w.WriteHeader(http.StatusNotFound)
		}
	case http.MethodGet:
		s.list(w, r, bucket, bdir)
	default:
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method)
	}
}

type listResult struct {
	XMLName     xml.Name     `xml:"http://s3.amazonaws.com/doc/2006-03-01/ ListBucketResult"`
	Name        string       `xml:"Name"`
	Prefix      string       `xml:"Prefix"`
	KeyCount    int          `xml:"KeyCount"`
	MaxKeys     int          `xml:"MaxKeys"`
	IsTruncated bool         `xml:"IsTruncated"`
	Contents    []listObject `xml:"Contents"`
}

type listObject struct {
	Key          string `xml:"Key"`
	LastModified string `xml:"LastModified"`
	ETag         string `xml:"ETag"`
	Size         int64  `xml:"Size"`
	StorageClass string `xml:"StorageClass"`
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, bucket, bdir string) {
	if _, err := os.Stat(bdir); err != nil {
		writeError(w, http.StatusNotFound, "NoSuchBucket", bucket)
		return
	}
	prefix := r.URL.Query().Get("prefix")
	res := listResult{Name: bucket, Prefix: prefix, MaxKeys: 1000}
	_ = filepath.WalkDir(bdir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".s3rdma-") {
			return nil
		}
		rel, _ := filepath.Rel(bdir, p)
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		res.Contents = append(res.Contents, listObject{Key: key, LastModified: info.ModTime().UTC().Format(time.RFC3339),
			ETag: etagOf(p), Size: info.Size(), StorageClass: "STANDARD"})
		return nil
	})
	sort.Slice(res.Contents, func(i, j int) bool { return res.Contents[i].Key < res.Contents[j].Key })
	res.KeyCount = len(res.Contents)
	w.Header().Set("Content-Type", "application/xml")
	_, _ = io.WriteString(w, xml.Header)
	_ = xml.NewEncoder(w).Encode(res)
}

// rdmaSetup checks the token and takes a channel and a registered buffer
// of size bytes; release undoes it.
func (s *Server) rdmaSetup(w http.ResponseWriter, tok string) (t cuobj.Token, ok bool) {
	if s.rdma == nil {
		s.Declined.Add(1)
		writeError(w, http.StatusNotImplemented, "NotImplemented", "RDMA is not enabled on this server")
		return t, false
	}
	t, err := cuobj.ParseToken(tok)
	if err != nil {
		writeError(w, http.StatusBadRequest, errInvalidToken, err.Error())
		return t, false
	}
	return t, true
}

type rdmaRun struct {
	ch      uint16
	buf     []byte
	reg     *cuobj.Buffer
	release func()
}

// peerOf returns the HTTP peer's address: the client address whose
// channels AllocateChannelFor counts.
func peerOf(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// rdmaError answers a failure of the RDMA path: admission refusals
// (cuobj.ErrOverloaded) are 503 SlowDown with Retry-After, a client that
// did not answer 504, anything else 500.
func (s *Server) rdmaError(w http.ResponseWriter, path string, err error) {
	var oe *cuobj.OverloadError
	switch {
	case errors.As(err, &oe):
		s.Overloaded.Add(1)
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((oe.RetryAfter+time.Second-1)/time.Second))))
		writeError(w, http.StatusServiceUnavailable, "SlowDown", err.Error())
	case errors.Is(err, cuobj.ErrConnectTimeout):
		s.ConnectTimeouts.Add(1)
		writeError(w, http.StatusGatewayTimeout, errTransferFailed, err.Error())
	default:
		s.log.Error("RDMA request failed", "path", path, "err", err)
		writeError(w, http.StatusInternalServerError, errTransferFailed, err.Error())
	}
}

// rdmaStart admits an RDMA request of size bytes: a channel (counted to
// the HTTP peer), the connection to the client the token names, and only
// then the budget and the buffer, so a token naming a client that does
// not answer costs no memory and a channel for at most the connect
// timeout. The caller calls rdmaEnd when ok.
func (s *Server) rdmaStart(w http.ResponseWriter, r *http.Request, path, tok string, size int) (*rdmaRun, bool) {
	ch, err := s.rdma.AllocateChannelFor(peerOf(r))
	if err != nil {
		s.rdmaError(w, path, err)
		return nil, false
	}
	if err := s.rdma.Connect(r.Context(), ch, tok); err != nil {
		s.rdma.FreeChannel(ch)
		s.rdmaError(w, path, err)
		return nil, false
	}
	release, err := s.rdma.Reserve(int64(size))
	if err != nil {
		s.rdma.FreeChannel(ch)
		s.rdmaError(w, path, err)
		return nil, false
	}
	buf, err := s.rdma.AllocHostBuffer(size)
	if err == nil {
		var reg *cuobj.Buffer
		if reg, err = s.rdma.RegisterBuffer(buf); err == nil {
			return &rdmaRun{ch: ch, buf: buf, reg: reg, release: release}, true
		}
	}
	release()
	s.rdma.FreeChannel(ch)
	writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
	return nil, false
}

func (s *Server) rdmaEnd(run *rdmaRun) {
	_ = s.rdma.DeregisterBuffer(run.reg)
	run.buf = nil
	run.release()
	s.rdma.FreeChannel(run.ch)
}

// transfer moves n bytes between the run's buffer and the client in
// requests of at most cuobj.MaxOpSize.
func (s *Server) transfer(ctx context.Context, run *rdmaRun, t *cuobj.Token, n uint64, put bool, key string) error {
	for off := uint64(0); off < n; off += cuobj.MaxOpSize {
		size := min(n-off, cuobj.MaxOpSize)
		req := &cuobj.Request{Key: key, Local: run.reg, LocalOffset: off, RemoteAddr: t.Addr + off, Size: size,
			Token: t.String(), Channel: run.ch}
		var err error
		if put {
			_, err = s.rdma.HandlePutObject(ctx, req)
		} else {
			_, err = s.rdma.HandleGetObject(ctx, req)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) rdmaGet(w http.ResponseWriter, r *http.Request, path, tok string) {
	t, ok := s.rdmaSetup(w, tok)
	if !ok {
		return
	}
	// Only the object's size is looked at before the client is reached:
	// the file is read once the RDMA connection is up.
	st, err := os.Stat(path)
	if err != nil {
		notFound(w, err)
		return
	}
	if st.IsDir() {
		writeError(w, http.StatusNotFound, "NoSuchKey", "no such object")
		return
	}
	start, length, ranged, err := parseRange(r.Header.Get("Range"), st.Size())
	if err != nil {
		writeError(w, http.StatusRequestedRangeNotSatisfiable, "InvalidRange", err.Error())
		return
	}
	n := min(uint64(length), uint64(t.Size), uint64(s.MaxObjectSize))
	reply := http.StatusOK
	if ranged || n < uint64(length) {
		reply = http.StatusPartialContent
	}
	if n == 0 {
		w.Header().Set(HeaderReply, strconv.Itoa(http.StatusNoContent))
		w.Header().Set(HeaderBytes, "0")
		w.Header().Set("Content-Length", "0")
		return
	}
	run, ok := s.rdmaStart(w, r, path, tok, int(n))
	if !ok {
		return
	}
	defer s.rdmaEnd(run)
	f, err := os.Open(path)
	if err != nil {
		notFound(w, err)
		return
	}
	defer f.Close()
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	if _, err := io.ReadFull(f, run.buf); err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	if err := s.transfer(r.Context(), run, &t, n, false, path); err != nil {
		s.rdmaError(w, path, err)
		return
	}
	s.RDMAGets.Add(1)
	s.RDMABytes.Add(n)
	w.Header().Set(HeaderReply, strconv.Itoa(reply))
	w.Header().Set(HeaderBytes, strconv.FormatUint(n, 10))
	w.Header().Set("Content-Length", "0")
}

func (s *Server) rdmaPut(w http.ResponseWriter, r *http.Request, path, tok string) {
	t, ok := s.rdmaSetup(w, tok)
	if !ok {
		return
	}
	if r.ContentLength > 0 {
		writeError(w, http.StatusBadRequest, "InvalidRequest", "an RDMA PUT has no body")
		return
	}
	n := uint64(t.Size)
	if n > uint64(s.MaxObjectSize) {
		writeError(w, http.StatusBadRequest, "EntityTooLarge", fmt.Sprintf("%d bytes, at most %d", n, s.MaxObjectSize))
		return
	}
	run, ok := s.rdmaStart(w, r, path, tok, int(n))
	if !ok {
		return
	}
	defer s.rdmaEnd(run)
	if err := s.transfer(r.Context(), run, &t, n, true, path); err != nil {
		s.rdmaError(w, path, err)
		return
	}
	sum, err := store(path, func(f *os.File) error { _, err := f.Write(run.buf); return err })
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	s.RDMAPuts.Add(1)
	s.RDMABytes.Add(n)
	w.Header().Set("ETag", sum)
	w.Header().Set(HeaderReply, strconv.Itoa(http.StatusOK))
	w.Header().Set("Content-Length", "0")
}

// parseRange reads a single "bytes=first-last" range (or none: the whole
// object) against an object of size bytes.
func parseRange(h string, size int64) (start, length int64, ranged bool, err error) {
	if h == "" {
		return 0, size, false, nil
	}
	spec, ok := strings.CutPrefix(h, "bytes=")
	a, b, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 || strings.Contains(spec, ",") {
		return 0, 0, false, fmt.Errorf("range %q", h)
	}
	first, err1 := strconv.ParseInt(a, 10, 64)
	if err1 != nil || first < 0 || (first >= size && size > 0) {
		return 0, 0, false, fmt.Errorf("range %q of %d bytes", h, size)
	}
	last := size - 1
	if b != "" {
		l, err := strconv.ParseInt(b, 10, 64)
		if err != nil || l < first {
			return 0, 0, false, fmt.Errorf("range %q", h)
		}
		last = min(l, size-1)
	}
	return first, max(last-first+1, 0), true, nil
}
