package qp

import (
	"math"
	"time"
)

// DCQCNParams are the settings of DCQCN (Zhu et al., "Congestion Control
// for Large-Scale RDMA Deployments", SIGCOMM 2015). Each field is named
// after the mlx5 congestion-control setting of the same meaning (the
// roce_rp/roce_np settings of ConnectX, rp_* and np_* in the mlx5 driver's
// cc_params); a zero field takes the default given with it. Rates are in
// bits per second.
//
// The defaults and formulas of the alpha and rate decrease settings
// (dce_tcp_g, dce_tcp_rtt, initial_alpha_value, rate_to_set_on_first_cnp,
// rpg_min_dec_fac, rpg_min_rate, rpg_gd, rate_reduce_monitor_period) are
// those of NVIDIA's "DCQCN CC Parameters" table for ConnectX-4 and later;
// the rate increase defaults (rpg_time_reset, rpg_byte_reset,
// rpg_threshold, rpg_ai_rate, rpg_hai_rate) are MLNX_OFED's as usually
// quoted, not confirmed against that table.
type DCQCNParams struct {
	// MaxRate (rp_max_rate) is the rate of a QP that is not limited,
	// and the rate the first cut starts from. mlx5 takes the port speed;
	// a software port has none, so the default is 10 Gb/s, about what one
	// core moves: set it to the path's speed.
	MaxRate int64
	// RateOnFirstCNP (rate_to_set_on_first_cnp): the current rate a QP
	// that was not limited takes before its first cut; 0 means MaxRate.
	RateOnFirstCNP int64
	// MinRate (rpg_min_rate): no cut goes below it. Default 1 Mb/s.
	MinRate int64
	// AIRate (rpg_ai_rate): the additive increase of the target rate.
	// Default 5 Mb/s.
	AIRate int64
	// HAIRate (rpg_hai_rate): the hyper increase step. Default 50 Mb/s.
	HAIRate int64
	// TimeReset (rpg_time_reset): the rate increase timer. Default 300 µs.
	TimeReset time.Duration
	// ByteReset (rpg_byte_reset): bytes sent per byte-counter increase
	// event. Default 32767.
	ByteReset int64
	// Threshold (rpg_threshold): increase events of the timer or the byte
	// counter before fast recovery ends (the paper's F). Default 1.
	Threshold int
	// GD (rpg_gd): a cut multiplies the rate by 1 - alpha×1024/2^GD with
	// alpha in [0, 1]; 11 is the paper's 1 - alpha/2. Default 11.
	GD int
	// MinDecFac (rpg_min_dec_fac): a cut leaves at least this percentage
	// of the rate. Default 50.
	MinDecFac int
	// DCETCPG (dce_tcp_g): the weight, in 1/1024, that an alpha update
	// keeps of the old alpha: alpha = alpha×G/1024 + (1 - G/1024)×[CNP in
	// the period]. Default 1019 (a gain of 5/1024, near the paper's 1/256).
	DCETCPG int
	// DCETCPRTT (dce_tcp_rtt): the alpha update period. Default 1 µs
	// (the paper's K is 55 µs). The updates are replayed on the next call,
	// so a short period costs nothing while nothing happens.
	DCETCPRTT time.Duration
	// InitialAlpha (initial_alpha_value) in 1/1023. Default 1023 (alpha 1).
	InitialAlpha int
	// RateReduceMonitorPeriod (rate_reduce_monitor_period): at most one
	// cut per period; CNPs in between are counted ignored. Default 4 µs.
	RateReduceMonitorPeriod time.Duration
	// MinTimeBetweenCNPs (min_time_between_cnps, notification point): a
	// QP sends at most one CNP per period. mlx5 firmware defaults to 0 (no
	// limit, per the driver's debugfs documentation); a software NP would
	// spend a packet per marked packet on it, so the default is 4 µs.
	MinTimeBetweenCNPs time.Duration
	// CNPDSCP (cnp_dscp, notification point) is the DSCP CNPs leave
	// with, 1..63; 0 takes mlx5's default, 48 (CS6: switches usually give
	// CNPs a class of their own, ahead of the data they slow down), and
	// NoCNPDSCP sends them with the QP's own DSCP instead. Their ECN field
	// is always Not-ECT. mlx5's cnp_802p_prio has no counterpart: goroce's
	// frames carry no 802.1Q tag of their own.
	CNPDSCP int
}

// NoCNPDSCP as DCQCNParams.CNPDSCP sends CNPs with the DSCP of their QP's
// traffic class.
const NoCNPDSCP = -1

// defaultCNPDSCP is mlx5's cnp_dscp default.
const defaultCNPDSCP = 48

// DefaultDCQCNParams returns the defaults of every field.
func DefaultDCQCNParams() DCQCNParams {
	var p DCQCNParams
	p.fill()
	return p
}

func (p *DCQCNParams) fill() {
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defI := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.MaxRate, 10e9)
	def(&p.MinRate, 1e6)
	def(&p.AIRate, 5e6)
	def(&p.HAIRate, 50e6)
	def(&p.ByteReset, 32767)
	defD(&p.TimeReset, 300*time.Microsecond)
	defD(&p.DCETCPRTT, time.Microsecond)
	defD(&p.RateReduceMonitorPeriod, 4*time.Microsecond)
	defD(&p.MinTimeBetweenCNPs, 4*time.Microsecond)
	defI(&p.Threshold, 1)
	defI(&p.GD, 11)
	defI(&p.MinDecFac, 50)
	defI(&p.DCETCPG, 1019)
	defI(&p.InitialAlpha, 1023)
	defI(&p.CNPDSCP, defaultCNPDSCP)
}

// valid reports whether the filled parameters make sense.
func (p *DCQCNParams) valid() bool {
	return p.MaxRate > 0 && p.MinRate > 0 && p.MinRate <= p.MaxRate &&
		p.RateOnFirstCNP >= 0 && p.RateOnFirstCNP <= p.MaxRate &&
		p.AIRate > 0 && p.HAIRate > 0 && p.ByteReset > 0 && p.TimeReset > 0 &&
		p.DCETCPRTT > 0 && p.RateReduceMonitorPeriod > 0 && p.MinTimeBetweenCNPs >= 0 &&
		p.Threshold > 0 && p.GD > 0 && p.GD < 32 && p.MinDecFac > 0 && p.MinDecFac <= 100 &&
		p.DCETCPG > 0 && p.DCETCPG < 1024 && p.InitialAlpha > 0 && p.InitialAlpha <= 1023 &&
		p.CNPDSCP >= NoCNPDSCP && p.CNPDSCP < 64
}

// maxCatchUp bounds the timer increase events one call replays: a QP idle
// that long (at the default, 19 ms) has recovered in all but name, and goes
// back to MaxRate.
const maxCatchUp = 64

// DCQCN is the reaction point of one QP: the rate DCQCN lets it send at.
// It is a pure state machine: every method takes the time as an argument
// (the engine's clock), it starts no timer and allocates nothing. The timers
// of the paper (alpha update, rate increase) are replayed on the next call
// after they would have fired, which is the same as firing them on time
// because nothing else happens in between.
//
// Cut (on a CNP, at most one per RateReduceMonitorPeriod): target = current,
// current ×= 1 - alpha/2, alpha moves toward 1 by g. Alpha decays toward 0
// by g each DCETCPRTT without a CNP. Increase events come from the timer
// (every TimeReset) and the byte counter (every ByteReset bytes): with
// neither stage past Threshold it is fast recovery (current halfway to
// target); once one passes it, additive increase (target += AIRate), once
// both do, hyper increase (target += i×HAIRate); the current rate then
// moves halfway to the target. A QP back at MaxRate is not limited.
type DCQCN struct {
	p *DCQCNParams

	limited bool
	rc, rt  float64 // current and target rate, bits/s
	alpha   float64

	alphaAt time.Duration // start of the current alpha period
	cnpSeen bool          // a CNP came in the current alpha period
	incAt   time.Duration // next timer increase event
	bytes   int64         // toward the next byte counter event
	t, bc   int           // timer and byte counter stages since the last cut
	cutAt   time.Duration // the last cut
}

// NewDCQCN returns a reaction point with p's settings (zero fields take
// their defaults). It fails on settings out of range.
func NewDCQCN(p DCQCNParams) (*DCQCN, error) {
	p.fill()
	if !p.valid() {
		return nil, ErrInvalidArgument
	}
	r := &DCQCN{}
	r.init(&p)
	return r, nil
}

func (r *DCQCN) init(p *DCQCNParams) {
	*r = DCQCN{p: p, alpha: float64(p.InitialAlpha) / 1023}
}

// Limited reports whether the QP sends below MaxRate.
func (r *DCQCN) Limited() bool { return r.limited }

// Rate returns the current rate in bits per second.
func (r *DCQCN) Rate() int64 {
	if !r.limited {
		return r.p.MaxRate
	}
	return int64(r.rc)
}

// Target returns the target rate in bits per second.
func (r *DCQCN) Target() int64 {
	if !r.limited {
		return r.p.MaxRate
	}
	return int64(r.rt)
}

// Alpha returns the congestion estimate, in [0, 1].
func (r *DCQCN) Alpha() float64 { return r.alpha }

// OnCNP takes a CNP received at now and reports whether it cut the rate;
// a CNP within RateReduceMonitorPeriod of the last cut is ignored.
func (r *DCQCN) OnCNP(now time.Duration) bool {
	r.Advance(now)
	p := r.p
	if r.limited && now-r.cutAt < p.RateReduceMonitorPeriod {
		r.cnpSeen = true
		return false
	}
	if !r.limited {
		r.limited = true
		r.rc = float64(p.MaxRate)
		if p.RateOnFirstCNP > 0 {
			r.rc = float64(p.RateOnFirstCNP)
		}
		// As mlx5's initial_alpha_value: a flow's first CNP starts from
		// it, not from what alpha decayed to while the flow was free.
		r.alpha = float64(p.InitialAlpha) / 1023
	}
	// The cut uses alpha as it stands, then alpha takes this CNP.
	f := r.alpha * 1024 / float64(uint64(1)<<p.GD)
	f = min(f, 1-float64(p.MinDecFac)/100)
	r.rt = r.rc
	r.rc = max(r.rc*(1-f), float64(p.MinRate))
	g := 1 - float64(p.DCETCPG)/1024
	r.alpha = (1-g)*r.alpha + g
	r.alphaAt = now
	r.cnpSeen = false
	r.t, r.bc, r.bytes = 0, 0, 0
	r.incAt = now + p.TimeReset
	r.cutAt = now
	return true
}

// OnSend counts n bytes sent at now toward the byte counter.
func (r *DCQCN) OnSend(now time.Duration, n int) {
	if !r.limited {
		return
	}
	r.Advance(now)
	if !r.limited {
		return
	}
	r.bytes += int64(n)
	for r.limited && r.bytes >= r.p.ByteReset {
		r.bytes -= r.p.ByteReset
		r.bc++
		r.increase()
	}
}

// Advance runs the alpha and increase timers due by now.
func (r *DCQCN) Advance(now time.Duration) {
	if !r.limited {
		return
	}
	p := r.p
	if k := (now - r.alphaAt) / p.DCETCPRTT; k > 0 {
		keep := float64(p.DCETCPG) / 1024
		if r.cnpSeen {
			// The first period saw a CNP that did not cut.
			r.alpha = keep*r.alpha + (1 - keep)
			k--
			r.alphaAt += p.DCETCPRTT
			r.cnpSeen = false
		}
		if k > 0 {
			r.alpha *= math.Pow(keep, float64(k))
			r.alphaAt += k * p.DCETCPRTT
		}
	}
	for i := 0; r.limited && now >= r.incAt; i++ {
		if i == maxCatchUp {
			r.limited = false
			break
		}
		r.incAt += p.TimeReset
		r.t++
		r.increase()
	}
}

// increase is one increase event of the timer or the byte counter.
func (r *DCQCN) increase() {
	p := r.p
	th := p.Threshold
	switch lo, hi := min(r.t, r.bc), max(r.t, r.bc); {
	case hi <= th:
		// fast recovery: the target stays
	case lo > th:
		r.rt += float64(lo-th) * float64(p.HAIRate)
	default:
		r.rt += float64(p.AIRate)
	}
	maxR := float64(p.MaxRate)
	r.rt = min(r.rt, maxR)
	r.rc = min((r.rt+r.rc)/2, maxR)
	if r.rc >= maxR-1 {
		r.limited = false
	}
}

// NextEvent returns when the next timer increase is due, if the QP is
// limited.
func (r *DCQCN) NextEvent() (time.Duration, bool) {
	return r.incAt, r.limited
}
