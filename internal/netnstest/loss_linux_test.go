// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package netnstest

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
)

// udpFrame is an Ethernet/IPv4/UDP frame to dport with a 64-byte payload
// (headers only as far as the dropper reads them).
func udpFrame(v6 bool, dport uint16) []byte {
	f := make([]byte, 14+40+8+64)
	if v6 {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		f[14] = 0x60
		f[20] = 17
		binary.BigEndian.PutUint16(f[14+40+2:], dport)
		return f
	}
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	f[14] = 0x45
	f[23] = 17
	binary.BigEndian.PutUint16(f[14+20+2:], dport)
	return f
}

// TestLossProgram runs the dropper on test frames (BPF_PROG_TEST_RUN): it
// drops about the asked share of RoCEv2 frames, counts them, and never
// touches other traffic.
func TestLossProgram(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	const runs = 4000
	for _, c := range []struct {
		name  string
		frame []byte
		p     float64
		lo    int
		hi    int
	}{
		{"roce4/p0.25", udpFrame(false, 4791), 0.25, 850, 1150},
		{"roce6/p0.05", udpFrame(true, 4791), 0.05, 140, 270},
		{"roce4/p0", udpFrame(false, 4791), 0, 0, 0},
		{"dns/p0.5", udpFrame(false, 53), 0.5, 0, 0},
		{"short/p0.5", udpFrame(false, 4791)[:50], 0.5, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			stats, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer stats.Close()
			prog, err := ebpf.NewProgram(lossProgram(c.p, stats))
			if err != nil {
				t.Fatal(err)
			}
			defer prog.Close()
			shot := 0
			for range runs {
				ret, _, err := prog.Test(c.frame)
				if err != nil {
					t.Fatal(err)
				}
				switch ret {
				case tcActShot:
					shot++
				case tcActOK:
				default:
					t.Fatalf("verdict %d", ret)
				}
			}
			if shot < c.lo || shot > c.hi {
				t.Errorf("dropped %d of %d, want %d to %d", shot, runs, c.lo, c.hi)
			}
			l := &LossInjector{prog: prog, stats: stats}
			passed, dropped, err := l.Counts()
			if err != nil {
				t.Fatal(err)
			}
			counted := c.lo != 0 || c.p == 0
			if counted && (dropped != uint64(shot) || passed+dropped != runs) {
				t.Errorf("counted %d passed, %d dropped; want %d, %d", passed, dropped, runs-shot, shot)
			}
			if !counted && passed+dropped != 0 {
				t.Errorf("counted non-RoCEv2 frames: %d passed, %d dropped", passed, dropped)
			}
		})
	}
}
