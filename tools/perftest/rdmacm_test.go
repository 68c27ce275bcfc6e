// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
)

// msgPipe is one end of an in-memory message channel: what one end sends,
// the other receives whole.
type msgPipe struct {
	in, out chan []byte
	sent    *[][]byte // every message sent by this end
}

func newMsgPipes() (a, b *msgPipe) {
	x, y := make(chan []byte, 4), make(chan []byte, 4)
	return &msgPipe{in: x, out: y, sent: new([][]byte)}, &msgPipe{in: y, out: x, sent: new([][]byte)}
}

func (p *msgPipe) SendMessage(ctx context.Context, b []byte) error {
	if len(b) > DestBinarySize {
		return fmt.Errorf("message of %d bytes overflows the peer's receive", len(b))
	}
	*p.sent = append(*p.sent, bytes.Clone(b))
	select {
	case p.out <- bytes.Clone(b):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *msgPipe) RecvMessage(ctx context.Context, b []byte) (int, error) {
	select {
	case m := <-p.in:
		return copy(b, m) + max(len(m)-len(b), 0), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (p *msgPipe) Close() error { return nil }

// TestDestBinaryLayout pins the record to struct pingpong_dest's layout on
// x86-64: five 32-bit fields, 4 bytes of padding, vaddr at 24, the GID at
// 32, srqn and gid_index after it; all big-endian.
func TestDestBinaryLayout(t *testing.T) {
	d := Dest{LID: 0x0102, OutReads: 0x10, QPN: 0x11, PSN: 0xABCDEF, RKey: 0xdeadbeef, VAddr: 0x0000561e4c602000,
		GID: ib.GIDFromAddr(netipMust("10.77.0.3")), SRQN: 5, GIDIndex: 1}
	want := "00000102" + "00000010" + "00000011" + "00abcdef" + "deadbeef" + "00000000" + "0000561e4c602000" +
		"00000000000000000000ffff0a4d0003" + "00000005" + "00000001"
	got := d.MarshalBinary()
	if hex.EncodeToString(got) != want {
		t.Fatalf("got  %x\nwant %s", got, want)
	}
	back, err := ParseDestBinary(got)
	if err != nil || back != d {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for _, n := range []int{0, 55, 57} {
		if _, err := ParseDestBinary(make([]byte, n)); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	// perftest leaves the padding and the upper bits of QPN and PSN as its
	// stack had them; they must not leak into the record.
	dirty := bytes.Clone(got)
	copy(dirty[20:24], []byte{0xAA, 0xBB, 0xCC, 0xDD})
	dirty[8], dirty[12] = 0xFF, 0xFF
	if back, err := ParseDestBinary(dirty); err != nil || back != d {
		t.Fatalf("dirty padding: %+v, %v", back, err)
	}
}

func FuzzParseDestBinary(f *testing.F) {
	f.Add(Dest{QPN: 0x13, PSN: 0x70b5a2, RKey: 0x451, VAddr: 0x561e4c602000, OutReads: 1, GIDIndex: 1}.MarshalBinary())
	f.Add(make([]byte, DestBinarySize))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDestBinary(b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		d2, err := ParseDestBinary(d.MarshalBinary())
		if err != nil || d2 != d {
			t.Fatalf("round trip: %+v → %+v, %v", d, d2, err)
		}
	})
}

// TestScriptOverRDMACM runs both ends of each test shape over a message
// channel: the rdma_cm prefix (empty record, CMConnect, empty record), no
// Connect, binary records, and no "done" at the close.
func TestScriptOverRDMACM(t *testing.T) {
	for _, tc := range []struct {
		name    string
		verb    Verb
		latency bool
	}{
		{"write_bw", Write, false}, {"send_lat", Send, true}, {"send_bw", Send, false},
		{"write_lat", Write, true}, {"read_lat", Read, true}, {"read_bw", Read, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pa, pb := newMsgPipes()
			type side struct {
				role     Role
				pipe     *msgPipe
				me       Dest
				out      Outcome
				err      error
				order    []string
				connects int
			}
			srv := &side{role: Server, pipe: pa, me: Dest{QPN: 0x21, RKey: 0x1111, VAddr: 0x1000, GIDIndex: 1}}
			cli := &side{role: Client, pipe: pb, me: Dest{QPN: 0x42, RKey: 0x2222, VAddr: 0x2000, GIDIndex: 1}}
			var wg sync.WaitGroup
			for _, s := range []*side{srv, cli} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := NewMessageConn(s.pipe, s.role)
					if _, _, _, err := c.Setup(ctx, ib.MTU1024); err != nil {
						s.err = err
						return
					}
					final := s.me
					s.me = Dest{GIDIndex: 1} // what the side knows before rdma_cm connects
					h := Hooks{
						Connect: func(context.Context, Dest) error { s.connects++; return nil },
						CMConnect: func(context.Context) (Dest, error) {
							s.order = append(s.order, fmt.Sprintf("cm after %d", len(*s.pipe.sent)))
							return final, nil
						},
					}
					if HasRun(tc.verb, tc.latency, s.role) {
						h.Run = func(context.Context) (BWReport, error) {
							s.order = append(s.order, "run")
							return BWReport{Size: 64, Iters: 5}, nil
						}
					}
					s.out, s.err = RunScript(ctx, c, tc.verb, tc.latency, s.me, h)
				}()
			}
			wg.Wait()
			for _, s := range []*side{srv, cli} {
				if s.err != nil {
					t.Fatalf("%v: %v", s.role, s.err)
				}
				if s.connects != 0 {
					t.Errorf("%v: Connect called over rdma_cm", s.role)
				}
				// Setup is 4 messages (version, page, cache line, MTU), then
				// the empty record; CMConnect comes next.
				if len(s.order) == 0 || s.order[0] != "cm after 5" {
					t.Errorf("%v: hooks ran %v", s.role, s.order)
				}
				for i, m := range *s.pipe.sent {
					if len(m) > DestBinarySize {
						t.Errorf("%v: message %d has %d bytes", s.role, i, len(m))
					}
				}
				if got := (*s.pipe.sent)[4]; !bytes.Equal(got, (Dest{GIDIndex: 1}).MarshalBinary()) {
					t.Errorf("%v: first record %x, want an empty one", s.role, got)
				}
				if (*s.pipe.sent)[0][0] != '6' {
					t.Errorf("%v: version message %q", s.role, (*s.pipe.sent)[0])
				}
			}
			if srv.out.Remote.QPN != 0x42 || cli.out.Remote.QPN != 0x21 || cli.out.Remote.RKey != 0x1111 || cli.out.Remote.VAddr != 0x1000 {
				t.Errorf("records: server saw %+v, client saw %+v", srv.out.Remote, cli.out.Remote)
			}
			if len(*srv.pipe.sent) != len(*cli.pipe.sent) {
				t.Errorf("server sent %d messages, client %d", len(*srv.pipe.sent), len(*cli.pipe.sent))
			}
			if !tc.latency && tc.verb != Send && (srv.out.RemoteReport == nil || srv.out.RemoteReport.Iters != 5) {
				t.Errorf("server got report %+v", srv.out.RemoteReport)
			}
		})
	}
}

// TestRDMACMSizeMismatch: a message of the wrong size means the ends are
// out of step, a typed error rather than a garbled value.
func TestRDMACMSizeMismatch(t *testing.T) {
	pa, pb := newMsgPipes()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go pb.SendMessage(ctx, []byte("6.06\x00"))
	c := NewMessageConn(pa, Server)
	if err := c.ExchangeVersions(ctx); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("got %v, want ErrBadRecord", err)
	}
}

// TestRDMACMFormat pins the header and address lines of -R to what
// ib_read_bw -R prints as server (rxe, perftest 6.06): the mode lines, the
// server's wait notice, and address lines without OUT, RKey or VAddr.
func TestRDMACMFormat(t *testing.T) {
	p := &Params{Verb: Read, Role: Server, Device: "rxe0", NumQPs: 1, Conn: "RC", Transport: "IB", PCIeRelax: "ON",
		CQMod: 1, MTU: 2048, LinkType: "Ethernet", GIDIndex: 1, OutReads: 128, RDMACM: true}
	h := Header(p)
	want := " Outstand reads  : 128\n rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n" + Line +
		" Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n" + Line
	if !strings.HasSuffix(h, want) {
		t.Errorf("header ends\n%q\nwant\n%q", h[max(len(h)-len(want), 0):], want)
	}
	d := Dest{QPN: 0x40, PSN: 0x4a4232, OutReads: 128, RKey: 0x31e4, VAddr: 0x55bf2295f000, GID: ib.GIDFromAddr(netipMust("10.77.0.2"))}
	if got, want := AddrLines(p, false, d), " local address: LID 0000 QPN 0x0040 PSN 0x4a4232\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:02\n"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	p.Role = Client
	if h := Header(p); strings.Contains(h, "Waiting") || !strings.HasSuffix(h, " Data ex. method : rdma_cm\n"+Line) {
		t.Errorf("client header:\n%s", h)
	}
}
