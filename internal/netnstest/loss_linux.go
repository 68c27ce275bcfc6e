// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package netnstest

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LossInjector drops RoCEv2 frames at random on the egress of some links
// of one netns: netem's "loss P%" for a kernel built without sch_netem.
type LossInjector struct {
	ns    string
	links []string
	prog  *ebpf.Program
	stats *ebpf.Map // [0] RoCEv2 frames passed, [1] dropped
}

// Offsets in struct __sk_buff.
const (
	skbData    = 76
	skbDataEnd = 80
)

const (
	tcActOK   = 0
	tcActShot = 2
)

// lossProgram returns a cls_bpf direct-action program that drops IPv4 and
// IPv6 UDP frames to port 4791 with probability p, counting into stats.
func lossProgram(p float64, stats *ebpf.Map) *ebpf.ProgramSpec {
	threshold := int32(p * math.MaxUint32) // p ≤ 0.5 fits
	const port = 0xb712                    // 4791 as a little-endian load of network order
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 58), // Ethernet + IPv6 + UDP dport, or a minimal RoCEv2/IPv4 frame
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JEq.Imm(asm.R5, 0x0008, "v4"),
		asm.JEq.Imm(asm.R5, int32(0xdd86), "v6"),
		asm.Ja.Label("pass"),

		asm.LoadMem(asm.R5, asm.R2, 23, asm.Byte).WithSymbol("v4"),
		asm.JNE.Imm(asm.R5, unix.IPPROTO_UDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14, asm.Byte),
		asm.JNE.Imm(asm.R5, 0x45, "pass"), // no IP options
		asm.LoadMem(asm.R5, asm.R2, 36, asm.Half),
		asm.JNE.Imm(asm.R5, port, "pass"),
		asm.Ja.Label("roll"),

		asm.LoadMem(asm.R5, asm.R2, 20, asm.Byte).WithSymbol("v6"),
		asm.JNE.Imm(asm.R5, unix.IPPROTO_UDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 56, asm.Half),
		asm.JNE.Imm(asm.R5, port, "pass"),

		asm.FnGetPrandomU32.Call().WithSymbol("roll"),
		asm.Mov.Imm(asm.R7, 0),
		asm.JGE.Imm(asm.R0, threshold, "count"),
		asm.Mov.Imm(asm.R7, 1),
		asm.StoreMem(asm.RFP, -4, asm.R7, asm.Word).WithSymbol("count"),
		asm.LoadMapPtr(asm.R1, stats.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "verdict"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol("verdict"),
		asm.JEq.Imm(asm.R7, 0, "exit"),
		asm.Mov.Imm(asm.R0, tcActShot),
		asm.Return().WithSymbol("exit"),

		asm.Mov.Imm(asm.R0, tcActOK).WithSymbol("pass"),
		asm.Return(),
	}
	return &ebpf.ProgramSpec{Name: "stress_loss", Type: ebpf.SchedCLS, License: "Apache-2.0", Instructions: insns}
}

// NewLoss attaches the dropper with probability p to the egress of links
// in netns ns. Close removes it (the clsact qdisc and its filter).
func NewLoss(ns string, links []string, p float64) (*LossInjector, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, err
	}
	stats, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		return nil, fmt.Errorf("stats map: %w", err)
	}
	prog, err := ebpf.NewProgram(lossProgram(p, stats))
	if err != nil {
		stats.Close()
		return nil, fmt.Errorf("loading the loss program: %w", err)
	}
	l := &LossInjector{ns: ns, prog: prog, stats: stats}
	err = InNamedNS(ns, func() error {
		for _, name := range links {
			link, err := netlink.LinkByName(name)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			q := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
				LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
			if err := netlink.QdiscAdd(q); err != nil {
				return fmt.Errorf("clsact on %s: %w", name, err)
			}
			l.links = append(l.links, name)
			f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index,
				Parent: netlink.HANDLE_MIN_EGRESS, Handle: netlink.MakeHandle(0, 1),
				Protocol: unix.ETH_P_ALL, Priority: 1}, Fd: prog.FD(), Name: "stress_loss", DirectAction: true}
			if err := netlink.FilterAdd(f); err != nil {
				return fmt.Errorf("loss filter on %s egress: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// Counts returns the RoCEv2 frames passed and dropped so far.
func (l *LossInjector) Counts() (passed, dropped uint64, err error) {
	if err := l.stats.Lookup(uint32(0), &passed); err != nil {
		return 0, 0, err
	}
	if err := l.stats.Lookup(uint32(1), &dropped); err != nil {
		return 0, 0, err
	}
	return passed, dropped, nil
}

// Close detaches the dropper from every link and frees the program.
func (l *LossInjector) Close() error {
	var errs []error
	if len(l.links) > 0 {
		errs = append(errs, InNamedNS(l.ns, func() error {
			var errs []error
			for _, name := range l.links {
				link, err := netlink.LinkByName(name)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				q := &netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
					LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
				if err := netlink.QdiscDel(q); err != nil {
					errs = append(errs, fmt.Errorf("removing clsact from %s: %w", name, err))
				}
			}
			return errors.Join(errs...)
		}))
		l.links = nil
	}
	l.prog.Close()
	l.stats.Close()
	return errors.Join(errs...)
}
