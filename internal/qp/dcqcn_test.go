package qp_test

import (
	"math"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
)

const us = time.Microsecond

// dcqcnStep is one input to a reaction point and what must hold after it.
type dcqcnStep struct {
	at    time.Duration
	cnp   bool // a CNP at at
	send  int  // bytes sent at at
	cut   bool // OnCNP's result, for a CNP
	rate  int64
	tgt   int64 // target rate; 0: not checked
	alpha float64
	lim   bool
}

func TestDCQCNTable(t *testing.T) {
	const G = 1e9
	// Simple numbers: 10 Gb/s line, alpha 1, g = 1/4 (G 768), timer and
	// byte counter stages counted from each cut.
	base := qp.DCQCNParams{
		MaxRate: 10 * G, MinRate: 100e6, AIRate: 100e6, HAIRate: 1e9,
		TimeReset: 100 * us, ByteReset: 1000, Threshold: 2, DCETCPG: 768,
		DCETCPRTT: 50 * us, RateReduceMonitorPeriod: 4 * us,
	}
	alphaAfterCut := func(a float64) float64 { return 0.75*a + 0.25 }
	a1 := alphaAfterCut(1)
	cases := []struct {
		name  string
		p     qp.DCQCNParams
		steps []dcqcnStep
	}{
		{"unlimited until a CNP", base, []dcqcnStep{
			{at: 10 * us, send: 1 << 20, rate: 10 * G, tgt: 10 * G, alpha: 1},
		}},
		{"first cut halves from line rate", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, tgt: 10 * G, alpha: a1, lim: true},
		}},
		{"rate_to_set_on_first_cnp", func() qp.DCQCNParams { p := base; p.RateOnFirstCNP = 4 * G; return p }(), []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 2 * G, tgt: 4 * G, alpha: a1, lim: true},
		}},
		{"CNP within the monitor period is ignored", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, alpha: a1, lim: true},
			{at: 3 * us, cnp: true, cut: false, rate: 5 * G, alpha: a1, lim: true},
			// ... but counts at the end of its alpha period.
			{at: 50 * us, rate: 5 * G, alpha: alphaAfterCut(a1), lim: true},
		}},
		{"second cut by the updated alpha", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, lim: true},
			{at: 10 * us, cnp: true, cut: true, rate: int64(5 * G * (1 - a1/2)), tgt: 5 * G, alpha: alphaAfterCut(a1), lim: true},
		}},
		{"alpha decays by g per period without CNP", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, lim: true, rate: 5 * G},
			{at: 99 * us, alpha: a1 * 0.75, lim: true, rate: 5 * G},
		}},
		{"fast recovery halves toward the target", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, lim: true},
			{at: 100 * us, rate: 7.5 * G, tgt: 10 * G, lim: true},
			{at: 200 * us, rate: 8.75 * G, tgt: 10 * G, lim: true},
		}},
		{"byte counter drives recovery too", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, lim: true},
			{at: 1 * us, send: 1000, rate: 7.5 * G, tgt: 10 * G, lim: true},
		}},
		{"additive increase after Threshold events", func() qp.DCQCNParams {
			p := base
			p.RateOnFirstCNP = 4 * G
			return p
		}(), []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 2 * G, tgt: 4 * G, lim: true},
			{at: 100 * us, rate: 3 * G, tgt: 4 * G, lim: true},     // T=1: fast recovery
			{at: 200 * us, rate: 3.5 * G, tgt: 4 * G, lim: true},   // T=2: fast recovery (Threshold events)
			{at: 300 * us, rate: 3.8 * G, tgt: 4.1 * G, lim: true}, // T=3: additive
		}},
		{"hyper increase when both stages pass Threshold", func() qp.DCQCNParams {
			p := base
			p.RateOnFirstCNP = 4 * G
			p.Threshold = 1
			return p
		}(), []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 2 * G, tgt: 4 * G, lim: true},
			{at: 1 * us, send: 1000, rate: 3 * G, tgt: 4 * G, lim: true},          // BC=1: fast recovery
			{at: 2 * us, send: 1000, rate: 3.55 * G, tgt: 4.1 * G, lim: true},     // BC=2: additive
			{at: 100 * us, rate: 3.875 * G, tgt: 4.2 * G, lim: true},              // T=1, BC=2: additive
			{at: 101 * us, send: 1000, rate: 4.0875 * G, tgt: 4.3 * G, lim: true}, // T=1, BC=3: additive
			{at: 200 * us, rate: 4.69375 * G, tgt: 5.3 * G, lim: true},            // T=2, BC=3: hyper, i=1
		}},
		{"a decayed alpha cuts less", base, []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, lim: true},
			{at: 100 * us, cnp: true, cut: true, rate: 5.390625 * G, tgt: 7.5 * G, alpha: 0.671875, lim: true},
		}},
		{"min rate floors the cut", func() qp.DCQCNParams {
			p := base
			p.RateOnFirstCNP = 150e6
			return p
		}(), []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 100e6, tgt: 150e6, lim: true},
		}},
		{"min_dec_fac bounds the cut", func() qp.DCQCNParams {
			p := base
			p.MinDecFac = 80
			return p
		}(), []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 8 * G, lim: true},
		}},
		{"back to line rate is unlimited", func() qp.DCQCNParams {
			p := base
			p.RateOnFirstCNP = 10 * G
			return p
		}(), []dcqcnStep{
			{at: 0, cnp: true, cut: true, rate: 5 * G, lim: true},
			{at: 10 * time.Millisecond, rate: 10 * G, tgt: 10 * G, lim: false},
			{at: 10*time.Millisecond + 1, cnp: true, cut: true, rate: 5 * G, lim: true},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := qp.NewDCQCN(c.p)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.steps {
				if s.cnp {
					if got := r.OnCNP(s.at); got != s.cut {
						t.Fatalf("step %d: OnCNP = %v, want %v", i, got, s.cut)
					}
				} else if s.send > 0 {
					r.OnSend(s.at, s.send)
				} else {
					r.Advance(s.at)
				}
				if r.Limited() != s.lim {
					t.Fatalf("step %d: limited %v, want %v", i, r.Limited(), s.lim)
				}
				if s.rate != 0 && !near(r.Rate(), s.rate) {
					t.Fatalf("step %d: rate %d, want %d", i, r.Rate(), s.rate)
				}
				if s.tgt != 0 && !near(r.Target(), s.tgt) {
					t.Fatalf("step %d: target %d, want %d", i, r.Target(), s.tgt)
				}
				if s.alpha != 0 && math.Abs(r.Alpha()-s.alpha) > 1e-9 {
					t.Fatalf("step %d: alpha %v, want %v", i, r.Alpha(), s.alpha)
				}
			}
		})
	}
}

func near(a, b int64) bool { return a-b <= 2 && b-a <= 2 }

func TestDCQCNParamsRejected(t *testing.T) {
	for _, p := range []qp.DCQCNParams{
		{MinRate: 20e9},
		{MaxRate: -1},
		{MinDecFac: 101},
		{DCETCPG: 1024},
		{GD: 40},
		{InitialAlpha: 2000},
		{RateOnFirstCNP: 20e9},
		{CNPDSCP: 64},
		{CNPDSCP: -2},
	} {
		if _, err := qp.NewDCQCN(p); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if _, err := qp.New(qp.Config{Clock: &fixedClock{}, CC: qp.CCConfig{DCQCN: true, Params: qp.DCQCNParams{GD: 40}}}); err == nil {
		t.Error("engine accepted GD 40")
	}
}

type fixedClock struct{ t time.Duration }

func (c *fixedClock) Now() time.Duration { return c.t }

func TestDCQCNDefaults(t *testing.T) {
	p := qp.DefaultDCQCNParams()
	want := qp.DCQCNParams{
		MaxRate: 10e9, MinRate: 1e6, AIRate: 5e6, HAIRate: 50e6,
		TimeReset: 300 * us, ByteReset: 32767, Threshold: 1, GD: 11, MinDecFac: 50,
		DCETCPG: 1019, DCETCPRTT: us, InitialAlpha: 1023,
		RateReduceMonitorPeriod: 4 * us, MinTimeBetweenCNPs: 4 * us, CNPDSCP: 48,
	}
	if p != want {
		t.Fatalf("defaults %+v\nwant %+v", p, want)
	}
}

func TestDCQCNNoAllocs(t *testing.T) {
	r, err := qp.NewDCQCN(qp.DCQCNParams{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Duration(0)
	n := testing.AllocsPerRun(1000, func() {
		now += 3 * us
		r.OnCNP(now)
		r.OnSend(now, 4096)
		r.Advance(now + 100*us)
	})
	if n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}
