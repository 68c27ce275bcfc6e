//go:build linux

package ecnmark

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Options configure a Marker.
type Options struct {
	// Port is the UDP destination port of the packets marked (0: 4791).
	Port uint16
	// Every marks one ECN-capable packet in this many (0 or 1: all),
	// counted per CPU: a sender that moves between CPUs gets up to
	// Every-1 fewer marks per CPU it used.
	Every uint32

	clsact bool // attach with clsact even where TCX is (tests)
}

// Clsact reports whether the marker is attached as a clsact filter
// rather than with TCX.
func (m *Marker) Clsact() bool { return m.filter != nil }

// Stats counts the packets to Options.Port the program saw, summed over
// all CPUs.
type Stats struct {
	ECT    uint64 // ECN-capable (ECT(0), ECT(1) or already CE)
	Marked uint64 // of those, marked CE here
	NotECT uint64 // Not-ECT: left alone
}

// Indexes of the per-CPU counter array; cntEvery counts ECN-capable
// packets up to Options.Every.
const (
	cntECT = iota
	cntMarked
	cntNotECT
	cntEvery
	numCounters
)

// Offsets in struct __sk_buff.
const (
	skbData    = 76
	skbDataEnd = 80
)

// Marker is the program attached at an interface's egress.
type Marker struct {
	prog     *ebpf.Program
	counters *ebpf.Map
	tcx      ebpflink.Link  // TCX attachment, or
	filter   netlink.Filter // the clsact filter
	qdisc    netlink.Qdisc  // the clsact qdisc added for it
	nl       *netlink.Handle
}

// ErrUnsupported reports a kernel that cannot run or attach the program.
var ErrUnsupported = errors.New("ecnmark: tc BPF not supported")

// Attach loads the program and attaches it at the egress of the interface
// with index ifindex, in the network namespace of the calling thread (nl,
// when not nil, is a netlink handle of that namespace for the clsact
// fallback).
func Attach(ifindex int, nl *netlink.Handle, opts Options) (*Marker, error) {
	if opts.Port == 0 {
		opts.Port = 4791
	}
	if opts.Every == 0 {
		opts.Every = 1
	}
	_ = rlimit.RemoveMemlock()
	counters, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "ecnmark_cnt",
		Type:       ebpf.PerCPUArray,
		KeySize:    4,
		ValueSize:  8,
		MaxEntries: numCounters,
	})
	if err != nil {
		return nil, fmt.Errorf("ecnmark: counters: %w", unsupported(err))
	}
	spec := programSpec(opts)
	if err := spec.Instructions.AssociateMap("counters", counters); err != nil {
		counters.Close()
		return nil, err
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		counters.Close()
		return nil, fmt.Errorf("ecnmark: load: %w", unsupported(err))
	}
	m := &Marker{prog: prog, counters: counters, nl: nl}
	if !opts.clsact {
		if m.tcx, err = ebpflink.AttachTCX(ebpflink.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXEgress}); err == nil {
			return m, nil
		}
	}
	if err := m.attachClsact(ifindex); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func unsupported(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	return err
}

// attachClsact is the fallback for kernels without TCX: a clsact qdisc
// and a direct-action BPF filter on its egress hook.
func (m *Marker) attachClsact(ifindex int) error {
	if m.nl == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		m.nl = h
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := m.nl.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ecnmark: clsact qdisc: %w", unsupported(err))
	}
	m.qdisc = q
	f := &netlink.BpfFilter{
		FilterAttrs:  netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_EGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd:           m.prog.FD(),
		Name:         "ecnmark",
		DirectAction: true,
	}
	if err := m.nl.FilterAdd(f); err != nil {
		return fmt.Errorf("ecnmark: tc filter: %w", unsupported(err))
	}
	m.filter = f
	return nil
}

// Stats returns the counters.
func (m *Marker) Stats() (Stats, error) {
	var s Stats
	for i, p := range []*uint64{&s.ECT, &s.Marked, &s.NotECT} {
		var per []uint64
		if err := m.counters.Lookup(uint32(i), &per); err != nil {
			return s, err
		}
		for _, v := range per {
			*p += v
		}
	}
	return s, nil
}

// Close detaches and unloads the program.
func (m *Marker) Close() error {
	if m.tcx != nil {
		m.tcx.Close()
	}
	if m.filter != nil {
		m.nl.FilterDel(m.filter)
	}
	if m.qdisc != nil {
		m.nl.QdiscDel(m.qdisc)
	}
	m.prog.Close()
	return m.counters.Close()
}

// be16 is the value a 16-bit load of the big-endian bytes of v yields on
// this host.
func be16(v uint16) int32 {
	return int32(binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)))
}

// Stack slots: the counter key, and the byte written back.
const (
	stackKey  = -4
	stackByte = -8
)

// programSpec assembles the program. R6 holds the skb throughout, R7 the
// offset of the byte whose low bits (IPv4) or bits 4-5 (IPv6) are the ECN
// field, R8 that byte, R9 the IP version.
func programSpec(opts Options) *ebpf.ProgramSpec {
	const (
		skb = asm.R6
		at  = asm.R7
		old = asm.R8
		ver = asm.R9
	)
	const eth = 14
	// count(i) adds one to counter i; it clobbers R0-R5.
	count := func(i int32, label string) asm.Instructions {
		return asm.Instructions{
			asm.StoreImm(asm.RFP, stackKey, int64(i), asm.Word).WithSymbol(label),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, stackKey),
			asm.LoadMapPtr(asm.R1, 0).WithReference("counters"),
			asm.FnMapLookupElem.Call(),
		}
	}
	insns := asm.Instructions{
		asm.Mov.Reg(skb, asm.R1),
		asm.LoadMem(asm.R2, skb, skbData, asm.Word),
		asm.LoadMem(asm.R3, skb, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, eth+40+8), // room for IPv6 + UDP, more than IPv4 needs
		asm.Mov.Reg(asm.R5, asm.R2),
		asm.Add.Imm(asm.R5, eth+20+8),
		asm.JGT.Reg(asm.R5, asm.R3, "ok"),
		asm.LoadMem(asm.R1, asm.R2, 12, asm.Half),
		asm.JEq.Imm(asm.R1, be16(0x0800), "ipv4"),
		asm.JNE.Imm(asm.R1, be16(0x86dd), "ok"),

		// IPv6: next header UDP, the port; the ECN field is in bits 4-5
		// of the second byte.
		asm.JGT.Reg(asm.R4, asm.R3, "ok"),
		asm.LoadMem(asm.R1, asm.R2, eth+6, asm.Byte),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_UDP, "ok"),
		asm.LoadMem(asm.R1, asm.R2, eth+40+2, asm.Half),
		asm.JNE.Imm(asm.R1, be16(opts.Port), "ok"),
		asm.Mov.Imm(ver, 6),
		asm.Mov.Imm(at, eth+1),
		asm.LoadMem(old, asm.R2, eth+1, asm.Byte),
		asm.Mov.Reg(asm.R1, old),
		asm.RSh.Imm(asm.R1, 4),
		asm.Ja.Label("ecn"),

		// IPv4 without options: UDP, the port; the ECN field is the low
		// bits of the TOS.
		asm.LoadMem(asm.R1, asm.R2, eth, asm.Byte).WithSymbol("ipv4"),
		asm.JNE.Imm(asm.R1, 0x45, "ok"),
		asm.LoadMem(asm.R1, asm.R2, eth+9, asm.Byte),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_UDP, "ok"),
		asm.LoadMem(asm.R1, asm.R2, eth+20+2, asm.Half),
		asm.JNE.Imm(asm.R1, be16(opts.Port), "ok"),
		asm.Mov.Imm(ver, 4),
		asm.Mov.Imm(at, eth+1),
		asm.LoadMem(old, asm.R2, eth+1, asm.Byte),
		asm.Mov.Reg(asm.R1, old),

		asm.And.Imm(asm.R1, 3).WithSymbol("ecn"),
		asm.JNE.Imm(asm.R1, 0, "ect"),
	}
	insns = append(insns, count(cntNotECT, "notect")...)
	insns = append(insns,
		asm.JEq.Imm(asm.R0, 0, "ok"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Ja.Label("ok"),
	)
	insns = append(insns, count(cntECT, "ect")...)
	insns = append(insns,
		asm.JEq.Imm(asm.R0, 0, "ok"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
	)
	// Every Nth: the per-CPU count of ECN-capable packets since the last
	// mark (the program runs with bottom halves off, so nothing else on
	// this CPU touches it meanwhile).
	insns = append(insns, count(cntEvery, "every")...)
	insns = append(insns,
		asm.JEq.Imm(asm.R0, 0, "ok"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.JLT.Imm(asm.R1, int32(opts.Every), "ok"),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),

		// Mark: the new byte, the IPv4 checksum, then the byte itself.
		asm.Mov.Reg(asm.R4, old),
		asm.Mov.Imm(asm.R1, 3),
		asm.JEq.Imm(ver, 4, "v4mark"),
		asm.Mov.Imm(asm.R1, 0x30),
		asm.Or.Reg(asm.R4, asm.R1).WithSymbol("v4mark"),
		asm.JEq.Reg(asm.R4, old, "ok"), // already CE: nothing to do
		asm.StoreMem(asm.RFP, stackByte, asm.R4, asm.Byte),
		asm.JNE.Imm(ver, 4, "store"),
		// bpf_l3_csum_replace(skb, 24, old word, new word, 2): the TOS is
		// the second byte of the header's first 16-bit word, so the words
		// differ in the TOS alone; as raw memory, the low byte of a
		// big-endian word is the higher address.
		asm.Mov.Reg(asm.R3, old),
	)
	// Build the 16-bit words from 0x45 and the TOS bytes, in memory order.
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 { // big-endian host
		insns = append(insns,
			asm.Or.Imm(asm.R3, 0x4500),
			asm.Or.Imm(asm.R4, 0x4500),
		)
	} else {
		insns = append(insns,
			asm.LSh.Imm(asm.R3, 8),
			asm.Or.Imm(asm.R3, 0x45),
			asm.LSh.Imm(asm.R4, 8),
			asm.Or.Imm(asm.R4, 0x45),
		)
	}
	insns = append(insns,
		asm.Mov.Reg(asm.R1, skb),
		asm.Mov.Imm(asm.R2, eth+10),
		asm.Mov.Imm(asm.R5, 2),
		asm.FnL3CsumReplace.Call(),
		asm.JNE.Imm(asm.R0, 0, "ok"),
		// bpf_skb_store_bytes(skb, at, &byte, 1, 0)
		asm.Mov.Reg(asm.R1, skb).WithSymbol("store"),
		asm.Mov.Reg(asm.R2, at),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stackByte),
		asm.Mov.Imm(asm.R4, 1),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "ok"),
	)
	insns = append(insns, count(cntMarked, "marked")...)
	insns = append(insns,
		asm.JEq.Imm(asm.R0, 0, "ok"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("ok"), // TC_ACT_OK
		asm.Return(),
	)
	return &ebpf.ProgramSpec{
		Name:         "ecnmark",
		Type:         ebpf.SchedCLS,
		License:      "Apache-2.0",
		Instructions: insns,
	}
}
