package rsocket

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/roce"
)

// TestDefaultSeries: rstream and riostream without -S/-C/-I run their
// built-in series (a latency run of 64 B, 4 KiB, 64 KiB and 1 MiB on one
// connection, then a bandwidth run of each on a second one: about 870 MB
// in 220,000 round trips), against goroce in both roles; both sides print
// the same eight result lines, and -T v checks every byte on both sides
// (it leaves the sizes and counts alone). The series cannot be shortened:
// any of -S/-C/-I makes a custom run. The goroce counters are logged at
// each result line.
//
// It runs when GOROCE_RSOCKET_SERIES is set, as `make test` (and so CI)
// and `make series` do, in a go test run of its own after the rest of the
// interop suite: the four runs take 15 to 25 minutes on a quiet host and far
// longer at load 25–30. Most of that is the 64-byte latency runs' 100,000
// round trips, each about 0.7–2 ms of a TCG guest that is busy for all of
// it (its qemu's CPU time equals the wall time) against goroce's 20–70 µs.
// Runs at once on separate guests do not help on two cores: four
// concurrent 64-byte latency runs took 3 to 7.5 times as long as one, and
// under load goroce's turnaround (mean 40–66 ms) then exceeded the guests'
// (16–19 ms).
//
// Each of the four runs is one case of rxelab.Lab.Case: bounded by
// seriesRunTimeout and by 2 minutes without a received frame, and rerun once on a restarted guest if the guest's NIC
// stalls or its qemu stops meanwhile (a fault of the lab, seen a few times
// per ten series on a quiet host, which without the watch hung the series
// until its binary's -timeout).
func TestDefaultSeries(t *testing.T) {
	if os.Getenv("GOROCE_RSOCKET_SERIES") == "" {
		t.Skip("rstream's and riostream's default series run on their own in `make test` and `make series` (GOROCE_RSOCKET_SERIES=1, -timeout 80m): 15 to 25 minutes of an emulated guest")
	}
	lab, g, _ := rxeSetup(t)
	c := rstreamCase{series: true, verify: true}
	t.Run("rstream/goroce-client", func(t *testing.T) { rstreamGuestServer(t, g.Addr, c) })
	t.Run("rstream/goroce-server", func(t *testing.T) { rstreamGuestClient(t, lab.PeerAddr, c) })
	t.Run("riostream/goroce-client", func(t *testing.T) { riostreamGuestServer(t, g.Addr, c) })
	t.Run("riostream/goroce-server", func(t *testing.T) { riostreamGuestClient(t, lab.PeerAddr, c) })
}

// seriesRunTimeout bounds one run of the default series: a run takes
// minutes on a quiet host and several times that on a loaded one, so the
// bound is wide; a run that hangs ends sooner, when goroce has received no
// frame for 2 minutes or its guest's NIC or qemu fails (rxelab.Lab.Case).
const seriesRunTimeout = 20 * time.Minute

// out is where a run's goroce side prints: buf, and for a series also the
// test log, each result line with what the device counters did meanwhile.
func (c rstreamCase) out(t testing.TB, dev *roce.Device, buf *bytes.Buffer) io.Writer {
	if !c.series {
		return buf
	}
	return io.MultiWriter(buf, &counterLog{t: t, dev: dev, last: dev.Counters(), at: time.Now()})
}

// counterLog logs each result line written with the time since the
// previous one and the device counters that changed meanwhile (retransmissions, probes'
// duplicate ACKs dropped, RNR NAKs, coalesced ACKs).
type counterLog struct {
	t    testing.TB
	dev  *roce.Device
	last roce.Counters
	at   time.Time
}

func (w *counterLog) Write(p []byte) (int, error) {
	if len(resultLines(string(p))) == 0 {
		return len(p), nil // the header, or a retried connection's
	}
	now, at := w.dev.Counters(), time.Now()
	a, b := w.last.Map(), now.Map()
	var d []string
	for _, n := range roce.CounterNames {
		if b[n] != a[n] {
			d = append(d, fmt.Sprintf("%s +%d", n, b[n]-a[n]))
		}
	}
	w.t.Logf("[%6.1fs] %s | device: %s", at.Sub(w.at).Seconds(), strings.TrimSpace(string(p)), strings.Join(d, ", "))
	w.last, w.at = now, at
	return len(p), nil
}
