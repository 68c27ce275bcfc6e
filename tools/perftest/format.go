// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Verb is the operation a perftest test measures.
type Verb int

const (
	Send Verb = iota
	Write
	Read
	Atomic
)

var verbNames = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

func (v Verb) String() string {
	if v < 0 || int(v) >= len(verbNames) {
		return fmt.Sprintf("Verb(%d)", int(v))
	}
	return verbNames[v]
}

// AtomicOp is the atomic operation of an Atomic test.
type AtomicOp int

const (
	CmpAndSwap AtomicOp = iota
	FetchAndAdd
)

func (a AtomicOp) String() string {
	if a == CmpAndSwap {
		return "CMP_AND_SWAP"
	}
	return "FETCH_AND_ADD"
}

// Line is perftest's separator line (RESULT_LINE), with its newline.
const Line = "---------------------------------------------------------------------------------------\n"

// WaitingBanner is what a perftest server prints before it accepts.
const WaitingBanner = "\n************************************\n* Waiting for client to connect... *\n************************************\n"

// Column headers (RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT), with newlines.
const (
	BWColumns      = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	BWColumnsGbits = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
	LatColumns     = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
)

// Params are the settings perftest's header and reports show.
type Params struct {
	Verb     Verb
	AtomicOp AtomicOp
	Latency  bool // a latency test, else bandwidth
	Role     Role
	Device   string
	NumQPs   int    // 1
	Conn     string // "RC"
	// Transport is the transport type ("IB" for rxe and for this stack).
	Transport   string
	PCIeRelax   string // "ON", "OFF" or "Unsupported"
	WRAPI       bool   // ibv_wr* API
	UseEvent    bool
	TxDepth     int
	RxDepth     int
	CQMod       int
	MTU         int // path MTU in bytes
	LinkType    string
	GIDIndex    int // -1: none given
	InlineSize  int
	OutReads    int
	ReportGbits bool
	RDMACM      bool // -R: QPs connected and data exchanged with rdma_cm
	Duplex      bool // -b
	PostList    int  // -l; shown above 1
	TOS         int  // -T; shown over rdma_cm when HasTOS
	HasTOS      bool
}

// Preamble is what perftest prints before it connects: a separator for
// read and atomic tests (from turning inline data off), and the server's
// waiting banner.
func Preamble(p *Params) string {
	var b strings.Builder
	if p.Verb == Read || p.Verb == Atomic {
		b.WriteString(Line)
	}
	if p.Role == Server {
		b.WriteString(WaitingBanner)
	}
	return b.String()
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

// Header returns the test information block (ctx_print_test_info), framed
// by separator lines.
func Header(p *Params) string {
	var b strings.Builder
	b.WriteString(Line)
	b.WriteString("                    ")
	b.WriteString(p.Verb.String() + " ")
	if p.Verb == Atomic {
		b.WriteString(p.AtomicOp.String() + " ")
	}
	if p.Latency {
		b.WriteString("Latency ")
	} else {
		if p.Duplex {
			b.WriteString("Bidirectional ")
		}
		if p.PostList > 1 {
			b.WriteString("Post List ")
		}
		b.WriteString("BW ")
	}
	b.WriteString("Test\n")
	if p.UseEvent {
		fmt.Fprintf(&b, " Test with events. Using %s_comp%d\n", p.Device, 0)
	}
	fmt.Fprintf(&b, " Dual-port       : %s\t\tDevice         : %s\n", "OFF", p.Device)
	fmt.Fprintf(&b, " Number of qps   : %d\t\tTransport type : %s\n", p.NumQPs, p.Transport)
	fmt.Fprintf(&b, " Connection type : %s\t\tUsing SRQ      : %s\n", p.Conn, "OFF")
	fmt.Fprintf(&b, " PCIe relax order: %s\n", p.PCIeRelax)
	fmt.Fprintf(&b, " ibv_wr* API     : %s\n", onOff(p.WRAPI))
	if p.Role == Client || p.Duplex {
		fmt.Fprintf(&b, " TX depth        : %d\n", p.TxDepth)
	}
	if p.PostList > 1 {
		fmt.Fprintf(&b, " Post List       : %d\n", p.PostList)
	}
	if p.Verb == Send && p.Role == Server {
		fmt.Fprintf(&b, " RX depth        : %d\n", p.RxDepth)
	}
	if !p.Latency {
		fmt.Fprintf(&b, " CQ Moderation   : %d\n", p.CQMod)
	}
	fmt.Fprintf(&b, " Mtu             : %d[B]\n", p.MTU)
	fmt.Fprintf(&b, " Link type       : %s\n", p.LinkType)
	if p.GIDIndex >= 0 {
		fmt.Fprintf(&b, " GID index       : %d\n", p.GIDIndex)
	}
	if p.Verb != Read && p.Verb != Atomic {
		fmt.Fprintf(&b, " Max inline data : %d[B]\n", p.InlineSize)
	} else {
		fmt.Fprintf(&b, " Outstand reads  : %d\n", p.OutReads)
	}
	fmt.Fprintf(&b, " rdma_cm QPs\t : %s\n", onOff(p.RDMACM))
	if p.RDMACM {
		b.WriteString(" Data ex. method : rdma_cm")
		if p.HasTOS {
			fmt.Fprintf(&b, " \tTOS    : %d", p.TOS)
		}
		if p.Role == Server {
			b.WriteString("\n" + Line + " Waiting for client rdma_cm QP to connect\n" +
				" Please run the same command with the IB/RoCE interface IP")
		}
		b.WriteString("\n")
	} else {
		b.WriteString(" Data ex. method : Ethernet\n")
	}
	b.WriteString(Line)
	return b.String()
}

// altHex formats v like C's "%#0<width>x": zero-padded to width including
// the "0x" prefix, which C leaves out for zero.
func altHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 0), v)
}

// AddrLines returns the "local address" or "remote address" line of d and
// its GID line (ctx_print_pingpong_data).
func AddrLines(p *Params, remote bool, d Dest) string {
	var b strings.Builder
	side := "local"
	if remote {
		side = "remote"
	}
	fmt.Fprintf(&b, " %s address: LID %s QPN %s PSN %s", side, altHex(uint64(d.LID), 4), altHex(uint64(d.QPN), 6), altHex(uint64(d.PSN), 6))
	verb := p.Verb
	if p.RDMACM {
		// perftest prints with the control channel's parameters, whose
		// verb is SEND in rdma_cm mode: no OUT, RKey or VAddr.
		verb = Send
	}
	switch verb {
	case Read:
		fmt.Fprintf(&b, " OUT %s", altHex(uint64(d.OutReads), 4))
		fallthrough
	case Write:
		fmt.Fprintf(&b, " RKey %s VAddr %s", altHex(uint64(d.RKey), 8), altHex(d.VAddr, 16))
	}
	b.WriteByte('\n')
	if p.GIDIndex >= 0 {
		b.WriteString(" GID: ")
		for i, g := range d.GID {
			if i > 0 {
				b.WriteByte(':')
			}
			fmt.Fprintf(&b, "%02d", g)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ResultColumns returns the separator and the column header of p's report.
func ResultColumns(p *Params) string {
	switch {
	case p.Latency:
		return Line + LatColumns
	case p.ReportGbits:
		return Line + BWColumnsGbits
	}
	return Line + BWColumns
}

// FormatBW returns a bandwidth result row (print_full_bw_report). Below
// 0.1 Gb/s perftest switches to six decimals.
func FormatBW(p *Params, r BWReport) string {
	if p.ReportGbits && r.BWAvg < 0.1 {
		return fmt.Sprintf(" %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
	}
	return fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
}

// BWTimes are the timestamps of a bandwidth run: when each message was
// posted and when its completion was seen (for unsignaled messages, the
// time of the completion that covered them), relative to any origin.
type BWTimes struct {
	Posted    []time.Duration
	Completed []time.Duration
}

// BWReportFrom computes perftest's bandwidth figures (print_report_bw) for
// size-byte messages completed cqMod at a time: the average over the whole
// run from the first post to the last completion, and the peak as the best
// per-message time over every window from a post to a later completion.
// Units are MB/s (2^20 bytes) or, with gbits, Gb/s (10^9 bits).
//
// perftest finds the peak with a loop over every window, O(n^2/cqMod):
// over a second for 40,000 messages signaled one by one, minutes for a
// million. This finds the same value in O(n log n) (see bestWindow).
func BWReportFrom(size uint64, cqMod int, t BWTimes, gbits bool) BWReport {
	n := min(len(t.Posted), len(t.Completed))
	if n == 0 {
		return BWReport{Size: size, Iters: 0}
	}
	// Every cqMod of n or more ends windows at n-1 alone; clamping keeps
	// the index arithmetic from overflowing for absurd values.
	cqMod = min(max(cqMod, 1), n)
	posted, completed := t.Posted[:n], t.Completed[:n]
	if !spanFits(posted, completed) {
		// Differences wrap around; only the window loop reproduces that.
		return bwReportQuadratic(size, cqMod, t, gbits)
	}
	total := completed[n-1] - posted[0]
	if total <= 0 {
		total = 1
	}
	best := total
	if d := bestWindow(cqMod, posted, completed); d < best {
		best = d
	}
	return bwReport(size, n, total, best, gbits)
}

// bwReportQuadratic is BWReportFrom as perftest computes it, window by
// window; the reference for tests and the path for timestamps whose
// differences overflow.
func bwReportQuadratic(size uint64, cqMod int, t BWTimes, gbits bool) BWReport {
	n := min(len(t.Posted), len(t.Completed))
	if n == 0 {
		return BWReport{Size: size, Iters: 0}
	}
	cqMod = max(cqMod, 1)
	total := t.Completed[n-1] - t.Posted[0]
	if total <= 0 {
		total = 1
	}
	best := total
	for i := 0; i < n; i++ {
		// Windows end where a completion was actually signaled.
		for j := ((i+1+cqMod-1)/cqMod)*cqMod - 1; j < n; j += cqMod {
			if d := (t.Completed[j] - t.Posted[i]) / time.Duration(j-i+1); d < best {
				best = d
			}
		}
		if n%cqMod != 0 {
			j := n - 1
			if d := (t.Completed[j] - t.Posted[i]) / time.Duration(j-i+1); d < best {
				best = d
			}
		}
	}
	return bwReport(size, n, total, best, gbits)
}

// bwReport converts the run's total time and best per-message time to
// perftest's figures.
func bwReport(size uint64, n int, total, best time.Duration, gbits bool) BWReport {
	r := BWReport{Size: size, Iters: uint64(n)}
	format := float64(1 << 20)
	if gbits {
		format = 125e6
	}
	if best <= 0 {
		best = 1
	}
	sec := total.Seconds()
	r.BWAvg = float64(size) * float64(n) / sec / format
	r.MsgRate = float64(n) / sec / 1e6
	r.BWPeak = float64(size) / best.Seconds() / format
	return r
}

// LatencyStats are perftest's latency figures in microseconds.
type LatencyStats struct {
	Size    uint64  `json:"size"`
	Iters   uint64  `json:"iterations"`
	Min     float64 `json:"t_min"`
	Max     float64 `json:"t_max"`
	Typical float64 `json:"t_typical"`
	Avg     float64 `json:"t_avg"`
	Dev     float64 `json:"t_stdev"`
	P99     float64 `json:"p99"`
	P999    float64 `json:"p99_9"`
	Samples int     `json:"samples"` // deltas used after dropping the tail
}

// LatencyFrom computes perftest's latency statistics (print_report_lat)
// from the post times of iters messages: the deltas between consecutive
// posts, divided by rttFactor (2 for ping-pong tests, where a delta is a
// round trip, 1 for read and atomic), sorted, without the two largest.
// perftest's quirks are kept: the median of an even count is the mean of the
// two middle values, the standard deviation sums squared differences
// truncated to whole microseconds, and t_max is the largest kept sample
// after the dropped ones' start (delta[n]).
func LatencyFrom(size uint64, posted []time.Duration, rttFactor int) (LatencyStats, error) {
	s := LatencyStats{Size: size, Iters: uint64(len(posted))}
	if len(posted) < 4 {
		return s, fmt.Errorf("perftest: latency needs at least 4 iterations, got %d", len(posted))
	}
	d := make([]time.Duration, len(posted)-1)
	for i := range d {
		d[i] = posted[i+1] - posted[i]
	}
	slices.Sort(d)
	n := len(d) - 2
	q := 1e3 * float64(rttFactor) // time.Duration units (ns) per reported usec
	var median time.Duration
	if (n-1)%2 != 0 {
		median = (d[n/2] + d[n/2-1]) / 2
	} else {
		median = d[n/2]
	}
	var sum float64
	for i := 0; i < n; i++ {
		sum += float64(d[i]) / q
	}
	avg := sum / float64(n)
	var dev float64
	for i := 0; i < n; i++ {
		v := int(avg - float64(d[i])/q)
		dev += float64(v * v)
	}
	i99 := int(math.Ceil(float64(n) * 0.99))
	i999 := int(math.Ceil(float64(n) * 0.999))
	s.Min = float64(d[0]) / q
	s.Max = float64(d[n]) / q
	s.Typical = float64(median) / q
	s.Avg = avg
	s.Dev = math.Sqrt(dev / float64(n))
	s.P99 = float64(d[i99]) / q
	s.P999 = float64(d[i999]) / q
	s.Samples = n
	return s, nil
}

// Format returns the latency result row (REPORT_FMT_LAT).
func (s LatencyStats) Format() string {
	return fmt.Sprintf(" %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		s.Size, s.Iters, s.Min, s.Max, s.Typical, s.Avg, s.Dev, s.P99, s.P999)
}
