// Package rcopy is rdma-core's rcopy (librdmacm/examples/rcopy.c) over
// goroce rsockets: a file copy whose either end may be the real tool.
//
// The protocol: every message starts with a 16-byte header {u8 version (0),
// u8 command, u16 len, u32 data, u64 id} in the host's byte order (rcopy
// does no byte swapping; x86 is little-endian, which this package uses).
// The client sends OPEN (data = st_mode, followed by the destination path,
// NUL-padded to a multiple of 8 bytes), WRITE (len 24, followed by the u64
// file size and then the file's bytes) and CLOSE; the server answers each
// with a header whose command has bit 0x80 set and whose data is an errno
// (0 for success).
package rcopy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
)

// DefaultPort is rcopy's port.
const DefaultPort = "7427"

const (
	cmdNoop  = 0
	cmdOpen  = 1
	cmdClose = 2
	cmdWrite = 3
	cmdResp  = 0x80
	hdrLen   = 16
)

var le = binary.LittleEndian

type hdr struct {
	version, command uint8
	len              uint16
	data             uint32
	id               uint64
}

func (h *hdr) put(b []byte) {
	b[0], b[1] = h.version, h.command
	le.PutUint16(b[2:], h.len)
	le.PutUint32(b[4:], h.data)
	le.PutUint64(b[8:], h.id)
}

func recvHdr(c io.Reader, out io.Writer) (hdr, error) {
	var b [hdrLen]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return hdr{}, err
	}
	h := hdr{version: b[0], command: b[1], len: le.Uint16(b[2:]), data: le.Uint32(b[4:]), id: le.Uint64(b[8:])}
	if h.version != 0 || h.len < hdrLen {
		fmt.Fprintf(out, "invalid version %d or length %d\n", h.version, h.len)
		return h, errors.New("rcopy: invalid header")
	}
	return h, nil
}

func sendResp(c io.Writer, m hdr, status uint32) error {
	var b [hdrLen]byte
	r := hdr{command: m.command | cmdResp, len: hdrLen, data: status, id: m.id}
	r.put(b[:])
	_, err := c.Write(b[:])
	return err
}

func getResp(c io.Reader, out io.Writer, cmd uint8) error {
	h, err := recvHdr(c, out)
	if err != nil {
		return err
	}
	if h.len != hdrLen || h.command != cmd|cmdResp {
		fmt.Fprintf(out, "invalid length %d or bad command response %x:%x\n", h.len, h.command, cmd|cmdResp)
		return errors.New("rcopy: bad response")
	}
	if h.data != 0 {
		return fmt.Errorf("rcopy: server: %w", syscall.Errno(h.data))
	}
	return nil
}

// Server is rcopy's server on port: it accepts one connection at a time
// and writes the files it is sent, until ctx ends. Paths are taken as the
// client names them, as rcopy does; Dir, if not empty, is prepended to
// relative ones.
type Server struct {
	Dev  *roce.Device
	Port string
	Dir  string
	Out  io.Writer
	// Listener, if set, is used instead of listening on Dev.
	Listener net.Listener
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	out := s.Out
	if out == nil {
		out = io.Discard
	}
	l := s.Listener
	if l == nil {
		port := s.Port
		if port == "" {
			port = DefaultPort
		}
		rl, err := rsocket.Listen(ctx, s.Dev, "tcp4", ":"+port)
		if err != nil {
			return fmt.Errorf("rbind failed: %w", err)
		}
		l = rl
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	defer l.Close()
	for {
		fmt.Fprint(out, "waiting for connection...")
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		fmt.Fprintf(out, "client: %s\n", host)
		s.process(c, out)
		c.Close()
	}
}

type session struct {
	f *os.File
}

func (s *Server) process(c net.Conn, out io.Writer) {
	var ss session
	defer func() {
		if ss.f != nil {
			ss.f.Close()
		}
	}()
	for {
		m, err := recvHdr(c, out)
		if err != nil {
			return
		}
		var ret uint32
		switch m.command {
		case cmdOpen:
			ret = s.open(c, m, &ss, out)
		case cmdClose:
			fmt.Fprint(out, "closing...")
			sendResp(c, m, 0)
			if ss.f != nil {
				ss.f.Close()
				ss.f = nil
			}
			fmt.Fprint(out, "done\n")
		case cmdWrite:
			ret = s.write(c, m, &ss, out)
		default:
			sendResp(c, m, uint32(syscall.EINVAL))
			return
		}
		if ret != 0 {
			return
		}
	}
}

func errno(err error) uint32 {
	var e syscall.Errno
	if errors.As(err, &e) {
		return uint32(e)
	}
	return uint32(syscall.EIO)
}

func (s *Server) open(c net.Conn, m hdr, ss *session, out io.Writer) uint32 {
	fmt.Fprint(out, "opening: ")
	var ret uint32
	if ss.f != nil {
		fmt.Fprint(out, "cannot open another file\n")
		ret = uint32(syscall.EBUSY)
	} else {
		b := make([]byte, int(m.len)-hdrLen)
		if _, err := io.ReadFull(c, b); err != nil {
			fmt.Fprint(out, "error receiving path\n")
			return 1
		}
		path := string(b)
		if i := strings.IndexByte(path, 0); i >= 0 {
			path = path[:i]
		}
		fmt.Fprintf(out, "%s, ", path)
		if s.Dir != "" && !strings.HasPrefix(path, "/") {
			path = s.Dir + "/" + path
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, os.FileMode(m.data&0o777))
		if err != nil {
			fmt.Fprint(out, "unable to open destination file\n")
			ret = errno(err)
		} else {
			ss.f = f
		}
	}
	sendResp(c, m, ret)
	return ret
}

func (s *Server) write(c net.Conn, m hdr, ss *session, out io.Writer) uint32 {
	fmt.Fprint(out, "transferring")
	var ret uint32
	switch {
	case ss.f == nil:
		fmt.Fprint(out, "...file not opened\n")
		ret = uint32(syscall.EINVAL)
	case m.len != hdrLen+8:
		fmt.Fprintf(out, "...invalid message length %d\n", m.len)
		ret = uint32(syscall.EINVAL)
	default:
		var b [8]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			ret = errno(err)
			break
		}
		n := int64(le.Uint64(b[:]))
		fmt.Fprintf(out, "...%d bytes...", n)
		if _, err := io.CopyN(ss.f, c, n); err != nil {
			fmt.Fprint(out, "...error receiving data\n")
			ret = errno(err)
		}
	}
	sendResp(c, m, ret)
	return ret
}

// Copy is rcopy's client: it sends src to the server at host (port) as dst
// and prints the tool's progress and result lines to out.
func Copy(ctx context.Context, dev *roce.Device, src, host, dst, port string, out io.Writer) error {
	if port == "" {
		port = DefaultPort
	}
	if out == nil {
		out = io.Discard
	}
	c, err := rsocket.Dial(ctx, dev, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		fmt.Fprintf(out, "rconnect failed\n: %v\n", err)
		return err
	}
	defer c.Close()
	return CopyOver(c, src, dst, out)
}

// CopyOver runs the client's side of the protocol over c.
func CopyOver(c net.Conn, src, dst string, out io.Writer) error {
	fmt.Fprint(out, "opening...")
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	plen := (len(dst) + 8) &^ 7
	msg := make([]byte, hdrLen+plen)
	mode := uint32(st.Mode().Perm()) | syscall.S_IFREG
	(&hdr{command: cmdOpen, len: uint16(len(msg)), data: mode}).put(msg)
	copy(msg[hdrLen:], dst)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	if err := getResp(c, out, cmdOpen); err != nil {
		return err
	}
	fmt.Fprint(out, "transferring")
	wm := make([]byte, hdrLen+8)
	(&hdr{command: cmdWrite, len: hdrLen + 8}).put(wm)
	le.PutUint64(wm[hdrLen:], uint64(size))
	if _, err := c.Write(wm); err != nil {
		return err
	}
	fmt.Fprint(out, "...")
	start := time.Now()
	_, err = io.CopyN(c, f, size)
	if err == nil {
		err = getResp(c, out, cmdWrite)
	}
	elapsed := time.Since(start)
	fmt.Fprint(out, "closing...")
	var cm [hdrLen]byte
	(&hdr{command: cmdClose, len: hdrLen}).put(cm[:])
	cerr := func() error {
		if _, err := c.Write(cm[:]); err != nil {
			return err
		}
		return getResp(c, out, cmdClose)
	}()
	if cerr == nil {
		fmt.Fprint(out, "done\n")
	}
	if err == nil {
		err = cerr
	}
	if err == nil {
		usec := float64(elapsed.Microseconds())
		if usec == 0 {
			usec = 1
		}
		fmt.Fprintf(out, "%d bytes in %.2f seconds = %.2f Gb/sec\n", size, usec/1000000, float64(size*8)/(1000*usec))
	}
	return err
}
