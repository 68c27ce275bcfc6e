package cuobj

import (
	"context"
	"testing"

	"github.com/goroce/goroce/roce"
)

// countPath is a path that counts the completions it is told of.
type countPath struct{ n int }

func (p *countPath) post(context.Context, *Token, *roce.SendWR) (uint32, error) { return 0, nil }
func (p *countPath) prepare(context.Context, *Token) error                      { return nil }
func (p *countPath) completed(uint32)                                           { p.n++ }
func (p *countPath) failed(uint32, bool)                                        {}
func (p *countPath) gone(uint32) bool                                           { return false }
func (p *countPath) abort()                                                     {}
func (p *countPath) close() error                                               { return nil }

// A channel's completions beyond its outstanding requests (the same one
// twice, or one of no request) are counted (Stray) and ignored: the
// outstanding count never goes below zero, where it would let more requests
// in than the CQ holds and keep PollWait waiting for nothing.
func TestStrayCompletion(t *testing.T) {
	s := &Server{t: DefaultTunables()}
	p := &countPath{}
	ch := &channel{p: p, pending: map[uint64]asyncReq{}}
	ch.outstanding = 1
	ch.pending[1] = asyncReq{handle: "async", get: true, size: 4096}
	wc := roce.WorkCompletion{WRID: 1, QPN: 5}
	if ev, async := s.complete(ch, &wc); !async || ev.Handle != "async" {
		t.Fatalf("first completion: %v %v", ev, async)
	}
	for range 3 {
		if _, async := s.complete(ch, &wc); async {
			t.Fatal("a second completion of the same request is an event")
		}
	}
	wc.WRID = 99
	s.complete(ch, &wc)
	// The one real completion counts as a GET, the strays as nothing.
	if s.stats.Gets.Load() != 1 || s.stats.GetBytes.Load() != 4096 {
		t.Errorf("counted %d GETs, %d bytes", s.stats.Gets.Load(), s.stats.GetBytes.Load())
	}
	if ch.outstanding != 0 || p.n != 1 || s.stats.Stray.Load() != 4 {
		t.Fatalf("outstanding %d, path told of %d completions, %d stray", ch.outstanding, p.n, s.stats.Stray.Load())
	}
}
