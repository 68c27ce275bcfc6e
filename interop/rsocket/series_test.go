package rsocket

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"sync"
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
// any of -S/-C/-I makes a custom run.
//
// The time goes to the guest: a TCG guest's qemu is busy for the whole
// series (its rxe, rsocket and wake-ups cost some 300–700 µs of emulated
// CPU per round trip, goroce's turnaround 20–70 µs), and the role makes no
// difference of its own. So the four runs go at once, each with a guest
// of its own: on a quiet host they share its cores, and on a loaded one
// four guests get four shares of the CPU instead of one.
// The goroce counters are logged at each result line.
func TestDefaultSeries(t *testing.T) {
	lab, _, _ := rxeSetup(t)
	if len(lab.Guests) < 4 {
		t.Fatalf("the lab has %d guests, want 4", len(lab.Guests))
	}
	runs := []struct {
		name        string
		run         func(*testing.T, netip.Addr, rstreamCase)
		guestServer bool
	}{
		{"rstream/goroce-client", rstreamGuestServer, true},
		{"rstream/goroce-server", rstreamGuestClient, false},
		{"riostream/goroce-client", riostreamGuestServer, true},
		{"riostream/goroce-server", riostreamGuestClient, false},
	}
	var wg sync.WaitGroup
	for i, r := range runs {
		// A port of its own: both goroce servers listen at once.
		c := rstreamCase{series: true, verify: true, guest: i, port: strconv.Itoa(7471 + i)}
		addr := lab.PeerAddr
		if r.guestServer {
			addr = lab.Guests[i].Addr
		}
		// Goroutines rather than t.Parallel, which runs only -parallel
		// (GOMAXPROCS) subtests at once.
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(r.name, func(t *testing.T) { r.run(t, addr, c) })
		}()
	}
	wg.Wait()
}

// out is where a run's goroce side prints: buf, and for a series also the
// test log, each result line with what the device counters did meanwhile.
func (c rstreamCase) out(t *testing.T, dev *roce.Device, buf *bytes.Buffer) io.Writer {
	if !c.series {
		return buf
	}
	return io.MultiWriter(buf, &counterLog{t: t, dev: dev, last: dev.Counters(), at: time.Now()})
}

// counterLog logs each result line written with the time since the
// previous one and the device counters that changed meanwhile (retransmissions, probes'
// duplicate ACKs dropped, RNR NAKs, coalesced ACKs).
type counterLog struct {
	t    *testing.T
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
