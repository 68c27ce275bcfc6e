package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/roce"
)

func init() {
	register("stat", command{
		summary: "show the counters of running devices and steering programs (rdma statistic)",
		run:     runStat,
	})
}

// publishStats makes dev's counters visible to "rocectl stat" until the
// returned function is called (devstat.Start without metrics).
func publishStats(dev *roce.Device, command string, stderr io.Writer) (stop func()) {
	stop, _ = devstat.Start(dev, devstat.Options{Command: command}, stderr)
	return stop
}

// statEntry is what stat reports about one interface.
type statEntry struct {
	Interface string `json:"interface"`
	// Running is true when a device process published its counters.
	Running  bool              `json:"running"`
	PID      int               `json:"pid,omitempty"`
	Command  string            `json:"command,omitempty"`
	Link     string            `json:"link,omitempty"`
	Fallback string            `json:"fallback,omitempty"`
	Started  *time.Time        `json:"started,omitempty"`
	Time     *time.Time        `json:"time,omitempty"`
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Steering are the counters of the goroce XDP program on the interface,
	// read from the kernel when possible, else as the device reported them.
	Steering *devstat.Steering `json:"steering,omitempty"`
	Error    string            `json:"error,omitempty"`
}

// runStat prints the counters of running devices and steering programs.
// Equivalent to: `rdma statistic show [link $dev/1] [-j]`, i.e.
// /sys/class/infiniband/$dev/ports/1/hw_counters/*.
func runStat(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ifname := fs.String("d", "", "network `interface` (default: every running device and goroce XDP program)")
	jsonOut := fs.Bool("j", false, "JSON output: an array with one object per interface")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: rocectl stat [-j] [-d IFACE]

Mirrors "rdma statistic show" (the rxe hw_counters) for goroce devices.
A device's counters live in the process running it: rocectl commands that
open a device publish them on the abstract unix socket @goroce/stat/IFACE of
their network namespace (package devstat), and stat asks each one for a
snapshot. Counters are named as rxe's hw_counters, then goroce's own.
stat also shows the redirected/no_socket/passed counters of the goroce XDP
steering program on the interface (the device's own, or one kept by
"rocectl link attach"); reading them from the kernel needs CAP_SYS_ADMIN or
CAP_BPF, otherwise the device's report is shown.

flags:`)
		fs.PrintDefaults()
	}
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "rocectl stat: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	names, err := statNames(*ifname)
	if err != nil {
		fmt.Fprintf(stderr, "rocectl stat: %v\n", err)
		return 1
	}
	entries := make([]statEntry, 0, len(names))
	status := 0
	for _, n := range names {
		e := collectStat(n)
		if !e.Running && e.Steering == nil {
			if *ifname != "" {
				status = 1
			}
			if e.Error == "" {
				e.Error = "no running goroce device and no goroce XDP program"
			}
		}
		entries = append(entries, e)
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(entries); err != nil {
			fmt.Fprintf(stderr, "rocectl stat: %v\n", err)
			return 1
		}
		return status
	}
	if len(entries) == 0 {
		fmt.Fprintln(stdout, "no running goroce devices")
	}
	for _, e := range entries {
		writeStat(stdout, e)
	}
	return status
}

// statNames are the interfaces stat reports: the one asked for, or every
// published device and every interface running the goroce program.
func statNames(ifname string) ([]string, error) {
	if ifname != "" {
		return []string{ifname}, nil
	}
	names, err := devstat.List()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, ifi := range ifs {
		if seen[ifi.Name] {
			continue
		}
		if _, ok := steeringOn(ifi.Index); ok {
			names = append(names, ifi.Name)
			seen[ifi.Name] = true
		}
	}
	sort.Strings(names)
	return names, nil
}

func collectStat(name string) statEntry {
	e := statEntry{Interface: name}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := devstat.Query(ctx, name)
	switch {
	case err == nil:
		e.Running = true
		e.PID, e.Command, e.Link, e.Fallback = s.PID, s.Command, s.Link, s.Fallback
		e.Started, e.Time = &s.Started, &s.Time
		e.Counters = s.Counters
		e.Steering = s.Steering
	case !errors.Is(err, devstat.ErrNoDevice):
		e.Error = err.Error()
	}
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		if e.Error == "" && !e.Running {
			e.Error = err.Error()
		}
		return e
	}
	prog, ok := steeringOn(ifi.Index)
	if !ok {
		return e
	}
	st, err := steeringStats(prog)
	if err != nil {
		if e.Steering == nil {
			e.Steering = prog
			if e.Error == "" {
				e.Error = "steering counters: " + err.Error()
			}
		}
		return e
	}
	e.Steering = st
	return e
}

func writeStat(w io.Writer, e statEntry) {
	switch {
	case e.Running:
		fmt.Fprintf(w, "link %s/1 pid %d", e.Interface, e.PID)
		if e.Command != "" {
			fmt.Fprintf(w, " (%s)", e.Command)
		}
		fmt.Fprintf(w, " over %s", e.Link)
		if e.Started != nil && e.Time != nil {
			fmt.Fprintf(w, ", up %v", e.Time.Sub(*e.Started).Round(time.Millisecond))
		}
		fmt.Fprintln(w)
		if e.Fallback != "" {
			fmt.Fprintf(w, "\tfallback: %s\n", e.Fallback)
		}
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
		names := append([]string(nil), roce.CounterNames...)
		known := map[string]bool{}
		for _, n := range names {
			known[n] = true
		}
		var extra []string
		for n := range e.Counters {
			if !known[n] {
				extra = append(extra, n)
			}
		}
		sort.Strings(extra)
		for _, n := range append(names, extra...) {
			if v, ok := e.Counters[n]; ok {
				fmt.Fprintf(tw, "\t%s\t%d\t\n", n, v)
			}
		}
		tw.Flush()
	default:
		fmt.Fprintf(w, "link %s/1 no running device\n", e.Interface)
	}
	if s := e.Steering; s != nil {
		fmt.Fprintf(w, "\txdp")
		if s.ProgramID != 0 {
			fmt.Fprintf(w, " id %d", s.ProgramID)
		}
		if s.Mode != "" {
			fmt.Fprintf(w, " %s", s.Mode)
		}
		fmt.Fprintf(w, ": redirected %d no_socket %d passed %d other_addr %d\n", s.Redirected, s.NoSocket, s.Passed, s.OtherAddr)
	}
	if e.Error != "" {
		fmt.Fprintf(w, "\t(%s)\n", e.Error)
	}
}
