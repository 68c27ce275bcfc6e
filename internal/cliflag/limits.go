// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package cliflag

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A check takes a flag's value as flag.Value.String prints it.
type check func(string) error

// RegistrationLimit is the largest memory region goroce registers: the
// 32-bit DMA length, less 64 KiB so that a region rounded to pages still
// fits.
const RegistrationLimit = 1<<32 - 64<<10

// maxWR is the deepest queue a QP takes (qp.MaxQPWR); the cap here keeps
// this package below the queue pair layer.
const maxWR = 1 << 14

// maxIters bounds iteration counts whose timestamps are kept: 16 bytes
// each, at both ends of a loopback run.
const maxIters = 100_000_000

// iterations checks an iteration count against maxIters and memory.
func iterations(lo int64) check {
	return func(s string) error {
		hi := int64(maxIters)
		if m := MemoryLimit() / 32; m > 0 && m < uint64(hi) {
			hi = int64(m)
		}
		return intRange(lo, hi, "the timestamps kept per iteration")(s)
	}
}

// products lists, per flag set, flags whose product is one registered
// buffer (fpga recv registers max-payload × depth as one region) or the
// memory of several (perf registers a buffer of twice -s per QP).
var products = map[string][][2]string{
	"fpga recv": {{"max-payload", "depth"}},
	"perf":      {{"s", "q"}}, // --size and --qp share their values
}

// MaxPerfQPs bounds perf's -q: each QP has its own buffer, CQs and posting
// goroutine (perftest allows 16384).
const MaxPerfQPs = 1024

// MaxShards is the most transmit shards a device takes (roce.Options.Shards).
const MaxShards = 64

// MaxQueues is the most receive queues the kernel UDP link takes
// (udplink.Options.Queues).
const MaxQueues = 64

// MaxInline is the largest inline payload a goroce QP takes (qp.MaxInline;
// perftest allows 1024).
const MaxInline = 400

// perfLimits are perf's checks, under perftest's short and long names.
func perfLimits() map[string]check {
	m := map[string]check{"timeout": timeout, "metrics": listenAddr,
		"shards": intRange(0, MaxShards, "a device's transmit shards; 0: the default"),
		"queues": intRange(0, MaxQueues, "the UDP link's receive queues; 0: one")}
	for _, c := range []struct {
		short, long string
		check       check
	}{
		{"s", "size", sizeOrZero},
		{"n", "iters", itersOrZero},
		{"x", "gid-index", gidIndex},
		{"t", "tx-depth", depthOrZero},
		{"r", "rx-depth", depthOrZero},
		{"Q", "cq-mod", depthOrZero},
		{"p", "port", port},
		{"q", "qp", intRange(1, MaxPerfQPs, "each QP has its own buffer, CQs and goroutine")},
		{"D", "duration", intRange(1, 1<<31-1, "")},
		{"I", "inline_size", intRange(0, MaxInline, "the largest inline payload of a goroce QP")},
		{"l", "post_list", depth},
		{"u", "qp-timeout", intRange(0, 31, "5-bit exponent")},
		{"T", "tos", intRange(0, 255, "8-bit")},
	} {
		m[c.short], m[c.long] = c.check, c.check
	}
	return m
}

// Shared checks, named for what they mean.
var (
	port       = intRange(1, 65535, "")
	portOrName = func(s string) error { // rsockets ports are getaddrinfo services
		if s != "" && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
			return port(s)
		}
		return nil
	}
	nonNegative = intRange(0, 1<<62, "")
	positive    = intRange(1, 1<<62, "")
	depth       = intRange(1, maxWR, "the deepest queue a QP takes")
	depthOrZero = intRange(0, maxWR, "the deepest queue a QP takes")
	iters       = iterations(1)
	itersOrZero = iterations(0)
	gidIndex    = intRange(-1, 255, "the GID table's last index")
	psn         = intRange(0, 1<<24-1, "24-bit")
	u32         = intRange(0, 1<<32-1, "32-bit")
	timeout     = duration(false)
	period      = duration(true)
	size        = memSize(1)
	sizeOrZero  = memSize(0)
)

// limits maps a flag set's name (what rocectl prints before the colon) and
// a flag's name to the check of its value. Only flags the user set are
// checked: defaults such as 0 for "the test's default" are valid by design.
var limits = map[string]map[string]check{
	"perf":      perfLimits(),
	"pingpong":  {"s": sizeOrZero, "n": iters, "g": gidIndex, "r": depth, "p": port, "timeout": timeout, "metrics": listenAddr},
	"rstream":   rsLimits(true),
	"riostream": rsLimits(false),
	"rcopy":     {"p": portOrName, "metrics": listenAddr},
	"rping": {"p": port, "C": nonNegative, "S": intRange(rpingMinSize, 64*1024-1, "rping's buffer"),
		"metrics": listenAddr, "connect-timeout": period},
	"naaice serve": {"p": port, "conns": intRange(1, 1<<16, ""), "rpcs": nonNegative, "metrics": listenAddr},
	"naaice call": {"f": intRange(1, 127, "7-bit function code"), "n": positive, "p": port,
		"pause": timeout, "t": period, "metrics": listenAddr},
	"fpga recv": {"metrics": listenAddr, "count": nonNegative, "timeout": timeout, "peer-qpn": psn, "peer-rq-psn": psn,
		"peer-sq-psn": psn, "gid-index": gidIndex, "max-payload": size, "depth": depth,
		"rnr-timer": intRange(0, 31, "5-bit code"), "idle": timeout, "hold": timeout},
	"fpga send": {"metrics": listenAddr, "count": nonNegative, "timeout": timeout, "peer-qpn": psn, "peer-rq-psn": psn,
		"peer-sq-psn": psn, "size": intRange(1, 4096, "the largest path MTU"), "rate": nonNegativeFloat,
		"channel": intRange(0, 255, "8-bit"), "retry": intRange(0, 7, "3-bit"), "peer-mr-rkey": u32,
		"peer-max-payload": sizeOrZero, "peer-depth": depthOrZero},
	"capture":     {"c": nonNegative, "duration": timeout, "port": port, "s": intRange(1, 262144, "the pcap snapshot limit")},
	"cuobj serve": {"udp-port": port, "metrics": listenAddr},
	"cuobj get":   {"udp-port": port, "metrics": listenAddr},
	"cuobj put":   {"udp-port": port, "metrics": listenAddr},
	"link attach": {"port": port, "duration": timeout},
}

// rpingMinSize is rping's RPING_MIN_BUFSIZE (cm/rping.MinSize).
const rpingMinSize = int64(len("2147483647") + 1 + len("rdma-ping-%d: ") + 1)

func rsLimits(keepalive bool) map[string]check {
	m := map[string]check{"S": transferSize, "C": positive, "I": positive, "B": intRange(0, 1<<30, ""),
		"i": intRange(0, 1<<16, ""), "p": portOrName, "metrics": listenAddr}
	if keepalive {
		m["k"] = nonNegative
	}
	return m
}

// listenAddr is a TCP address to listen on, as net.Listen takes it:
// [host]:port, the port a number (0: any free port) or a service name.
func listenAddr(s string) error {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("not host:port (\"127.0.0.1:9100\", \":9100\")")
	}
	if strings.ContainsAny(host, "/ ") {
		return errors.New("not a host name or address")
	}
	if p == "" {
		return errors.New("no port")
	}
	if p[0] >= '0' && p[0] <= '9' || p[0] == '-' {
		return intRange(0, 65535, "")(p)
	}
	return nil
}

// transferSize is rstream's -S: a size, or "all".
func transferSize(s string) error {
	if strings.HasPrefix(strings.ToLower(s), "all") {
		return nil
	}
	return size(s)
}

func intRange(lo, hi int64, why string) check {
	return func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(s, "-") {
				n = hi + 1
			} else if errors.Is(err, strconv.ErrRange) {
				n = lo - 1
			} else {
				return errors.New("not an integer")
			}
		}
		why := why
		if why != "" {
			why = " (" + why + ")"
		}
		switch {
		case n < lo && lo == 0:
			return errors.New("must not be negative")
		case n < lo:
			return fmt.Errorf("must be at least %d", lo)
		case n > hi:
			return fmt.Errorf("must be at most %d%s", hi, why)
		}
		return nil
	}
}

func nonNegativeFloat(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != f {
		return errors.New("not a number")
	}
	if f < 0 {
		return errors.New("must not be negative")
	}
	return nil
}

// duration checks a duration flag: never negative, and with positive
// set, not zero either.
func duration(positive bool) check {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return errors.New("not a duration")
		case d < 0:
			return errors.New("must not be negative")
		case d == 0 && positive:
			return errors.New("must be positive")
		}
		return nil
	}
}

// memSize checks a buffer size: at least lo, at most what goroce registers
// and at most MemoryLimit, so that a typo fails here and not as an
// out-of-memory crash.
func memSize(lo int64) check {
	return func(s string) error {
		if err := intRange(lo, RegistrationLimit, "the registration limit")(s); err != nil {
			return err
		}
		n, _ := strconv.ParseInt(s, 10, 64)
		return CheckMemory(uint64(n))
	}
}

// MemoryLimit is the most one buffer may take: a quarter of the machine's
// memory (0 where unknown).
func MemoryLimit() uint64 { return totalMemory() / 4 }

// CheckMemory tells whether n bytes fit one registration and MemoryLimit.
func CheckMemory(n uint64) error {
	if n > RegistrationLimit {
		return fmt.Errorf("must be at most %d (the registration limit)", uint64(RegistrationLimit))
	}
	if m := MemoryLimit(); m > 0 && n > m {
		return fmt.Errorf("must be at most %d (a quarter of this machine's memory)", m)
	}
	return nil
}

// totalMemory is MemTotal of /proc/meminfo in bytes, 0 where unknown.
var totalMemory = sync.OnceValue(func() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
})
