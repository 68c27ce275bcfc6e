//go:build linux

package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// DefaultPort is the RoCEv2 UDP destination port (IANA).
const DefaultPort = 4791

// DefaultQueues is the XSKMAP size used when Options.Queues is 0.
const DefaultQueues = 64

// maxQueues bounds Options.Queues; no NIC has more RX queues.
const maxQueues = 4096

// MaxAddrs bounds SetLocalAddrs: the size of the program's address map. A
// RoCE device's GID table has far fewer entries.
const MaxAddrs = 256

// Options configures Load.
type Options struct {
	// Port is the UDP destination port to steer (0: DefaultPort).
	Port uint16
	// Queues is the XSKMAP size: RX queues 0..Queues-1 can be steered
	// (0: DefaultQueues).
	Queues int
	// Frags loads the program with BPF_F_XDP_HAS_FRAGS (Linux 5.18), so it
	// may attach in driver mode where frames span several buffers (veth
	// with a peer MTU above 3506, jumbo frames) and feed multi-buffer AF_XDP
	// sockets.
	Frags bool
}

// Stats counts the program's decisions, summed over all CPUs.
type Stats struct {
	Redirected uint64 // steered to an AF_XDP socket
	NoSocket   uint64 // matched the port, but no socket was registered for the RX queue: passed on
	Passed     uint64 // not RoCEv2 (or malformed/truncated): passed to the kernel stack
	OtherAddr  uint64 // RoCEv2, but to an address outside SetLocalAddrs: passed to the kernel stack
}

// Indexes of the stats array.
const (
	statRedirected = iota
	statNoSocket
	statPassed
	statOtherAddr
	numStats
)

// XDP return codes (enum xdp_action).
const (
	xdpPass     = 2
	xdpRedirect = 4
)

// Offsets in struct xdp_md.
const (
	mdData         = 0
	mdDataEnd      = 4
	mdRxQueueIndex = 16
)

// Program is the loaded steering program with its XSKMAP and counters.
type Program struct {
	mu          sync.Mutex
	opts        Options
	prog        *ebpf.Program
	xsks        *ebpf.Map
	stats       *ebpf.Map
	addrs       *ebpf.Map // destination addresses steered when filtering
	filter      *ebpf.Map // [0] != 0: steer only frames to addrs
	attachments map[*Attachment]struct{}
	closed      bool
}

var memlockOnce sync.Once

// Load creates the XSKMAP and the counters and loads the program.
//
// On kernels before 5.11, BPF memory is charged to RLIMIT_MEMLOCK; Load
// then raises the process's limit (cilium/ebpf rlimit.RemoveMemlock).
func Load(opts Options) (*Program, error) {
	if opts.Port == 0 {
		opts.Port = DefaultPort
	}
	if opts.Queues == 0 {
		opts.Queues = DefaultQueues
	}
	if opts.Queues < 0 || opts.Queues > maxQueues {
		return nil, fmt.Errorf("%w: Options.Queues %d not in [1, %d]", ErrQueueRange, opts.Queues, maxQueues)
	}
	memlockOnce.Do(func() { _ = rlimit.RemoveMemlock() })

	xsks, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "goroce_xsks",
		Type:       ebpf.XSKMap,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: uint32(opts.Queues),
	})
	if err != nil {
		return nil, loadError("create XSKMAP", err, &UnsupportedError{Feature: "XSKMAP (AF_XDP)", MinKernel: "4.18"})
	}
	stats, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "goroce_stats",
		Type:       ebpf.PerCPUArray,
		KeySize:    4,
		ValueSize:  8,
		MaxEntries: numStats,
	})
	if err != nil {
		xsks.Close()
		return nil, loadError("create stats map", err, &UnsupportedError{Feature: "per-CPU array map", MinKernel: "4.6"})
	}
	addrs, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "goroce_addrs",
		Type:       ebpf.Hash,
		KeySize:    16,
		ValueSize:  4,
		MaxEntries: MaxAddrs,
	})
	if err != nil {
		xsks.Close()
		stats.Close()
		return nil, loadError("create address map", err, &UnsupportedError{Feature: "hash map", MinKernel: "3.19"})
	}
	filter, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "goroce_filter",
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: 1,
	})
	if err != nil {
		xsks.Close()
		stats.Close()
		addrs.Close()
		return nil, loadError("create filter map", err, &UnsupportedError{Feature: "array map", MinKernel: "3.19"})
	}
	closeMaps := func() {
		xsks.Close()
		stats.Close()
		addrs.Close()
		filter.Close()
	}
	spec := programSpec(opts.Port, opts.Frags)
	for name, m := range map[string]*ebpf.Map{"xsks": xsks, "stats": stats, "addrs": addrs, "filter": filter} {
		if err := spec.Instructions.AssociateMap(name, m); err != nil {
			closeMaps()
			return nil, err
		}
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		closeMaps()
		if opts.Frags && errors.Is(err, unix.EINVAL) && !haveFrags() {
			return nil, fmt.Errorf("load XDP program: %w", &UnsupportedError{Feature: "XDP frags (BPF_F_XDP_HAS_FRAGS)", MinKernel: "5.18", Err: err})
		}
		return nil, loadError("load XDP program", err, &UnsupportedError{Feature: "XDP redirect to an XSKMAP", MinKernel: "4.18"})
	}
	return &Program{
		opts:        opts,
		prog:        prog,
		xsks:        xsks,
		stats:       stats,
		addrs:       addrs,
		filter:      filter,
		attachments: make(map[*Attachment]struct{}),
	}, nil
}

func loadError(what string, err error, unsup *UnsupportedError) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%s: %w: %v", what, ErrPermission, err)
	case errors.Is(err, ebpf.ErrNotSupported):
		unsup.Err = err
		return fmt.Errorf("%s: %w", what, unsup)
	}
	return fmt.Errorf("%s: %w", what, err)
}

var fragsProbe struct {
	once sync.Once
	ok   bool
}

// haveFrags reports whether the kernel accepts BPF_F_XDP_HAS_FRAGS, by
// loading a program that only returns XDP_PASS.
func haveFrags() bool {
	fragsProbe.once.Do(func() {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:       ebpf.XDP,
			AttachType: ebpf.AttachXDP,
			Flags:      unix.BPF_F_XDP_HAS_FRAGS,
			License:    "Apache-2.0",
			Instructions: asm.Instructions{
				asm.Mov.Imm(asm.R0, xdpPass),
				asm.Return(),
			},
		})
		if err == nil {
			p.Close()
			fragsProbe.ok = true
		}
	})
	return fragsProbe.ok
}

// be16 returns the value a 16-bit load of the big-endian bytes of v yields
// on this host, so the program compares header fields without byte swaps.
func be16(v uint16) int32 {
	return int32(binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)))
}

// be32 is be16 for the 32-bit word of the bytes of v.
func be32(v uint32) int64 {
	return int64(int32(binary.NativeEndian.Uint32(binary.BigEndian.AppendUint32(nil, v))))
}

// Stack slots of the program: the destination address as an address-map
// key (16 bytes, IPv4 as ::ffff:a.b.c.d), and a 4-byte map key.
const (
	stackAddr = -24
	stackKey  = -4
)

// programSpec assembles the steering program; doc.go describes its logic.
func programSpec(port uint16, frags bool) *ebpf.ProgramSpec {
	const (
		ctx    = asm.R6 // struct xdp_md
		cur    = asm.R7 // start of the next header
		ret    = asm.R8 // the verdict returned
		ethTyp = asm.R5
		end    = asm.R3 // data_end
		next   = asm.R4 // cur + header length, compared to end
	)
	insns := asm.Instructions{
		asm.Mov.Reg(ctx, asm.R1),
		asm.LoadMem(asm.R2, ctx, mdData, asm.Word),
		asm.LoadMem(end, ctx, mdDataEnd, asm.Word),
		asm.Mov.Reg(cur, asm.R2),
		asm.Add.Imm(cur, 14),
		asm.JGT.Reg(cur, end, "pass"),
		asm.LoadMem(ethTyp, asm.R2, 12, asm.Half),
	}
	// Up to two VLAN tags (802.1ad outer, 802.1Q inner, in either order).
	for i := range 2 {
		tag := fmt.Sprintf("vlan%d", i)
		done := fmt.Sprintf("novlan%d", i)
		insns = append(insns,
			asm.JEq.Imm(ethTyp, be16(0x8100), tag),
			asm.JEq.Imm(ethTyp, be16(0x88a8), tag),
			asm.Ja.Label(done),
			asm.Mov.Reg(next, cur).WithSymbol(tag),
			asm.Add.Imm(next, 4),
			asm.JGT.Reg(next, end, "pass"),
			asm.LoadMem(ethTyp, cur, 2, asm.Half),
			asm.Mov.Reg(cur, next),
			asm.Mov.Reg(cur, cur).WithSymbol(done), // landing pad
		)
	}
	insns = append(insns,
		asm.JEq.Imm(ethTyp, be16(0x0800), "ipv4"),
		asm.JEq.Imm(ethTyp, be16(0x86dd), "ipv6"),
		asm.Ja.Label("pass"),

		// IPv4: version 4, IHL >= 5, protocol UDP, not a fragment.
		asm.Mov.Reg(next, cur).WithSymbol("ipv4"),
		asm.Add.Imm(next, 20),
		asm.JGT.Reg(next, end, "pass"),
		// The destination as an IPv4-mapped address-map key.
		asm.StoreImm(asm.RFP, stackAddr, 0, asm.Word),
		asm.StoreImm(asm.RFP, stackAddr+4, 0, asm.Word),
		asm.StoreImm(asm.RFP, stackAddr+8, be32(0x0000ffff), asm.Word),
		asm.LoadMem(asm.R2, cur, 16, asm.Word),
		asm.StoreMem(asm.RFP, stackAddr+12, asm.R2, asm.Word),
		asm.LoadMem(asm.R0, cur, 0, asm.Byte),
		asm.Mov.Reg(asm.R1, asm.R0),
		asm.RSh.Imm(asm.R1, 4),
		asm.JNE.Imm(asm.R1, 4, "pass"),
		asm.And.Imm(asm.R0, 0x0f),
		asm.JLT.Imm(asm.R0, 5, "pass"),
		asm.LoadMem(asm.R1, cur, 9, asm.Byte),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_UDP, "pass"),
		// MF or a fragment offset: the kernel reassembles; RoCEv2 sets DF.
		asm.LoadMem(asm.R1, cur, 6, asm.Half),
		asm.And.Imm(asm.R1, be16(0x3fff)),
		asm.JNE.Imm(asm.R1, 0, "pass"),
		asm.LSh.Imm(asm.R0, 2), // header length 20..60, bounded for the verifier
		asm.Add.Reg(cur, asm.R0),
		asm.Ja.Label("udp"),

		// IPv6: version 6, next header UDP (extension headers are passed).
		asm.Mov.Reg(next, cur).WithSymbol("ipv6"),
		asm.Add.Imm(next, 40),
		asm.JGT.Reg(next, end, "pass"),
	)
	// The destination address (bytes 24..39) as the address-map key.
	for i := int16(0); i < 16; i += 4 {
		insns = append(insns,
			asm.LoadMem(asm.R2, cur, 24+i, asm.Word),
			asm.StoreMem(asm.RFP, stackAddr+i, asm.R2, asm.Word),
		)
	}
	insns = append(insns,
		asm.LoadMem(asm.R0, cur, 0, asm.Byte),
		asm.RSh.Imm(asm.R0, 4),
		asm.JNE.Imm(asm.R0, 6, "pass"),
		asm.LoadMem(asm.R1, cur, 6, asm.Byte),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_UDP, "pass"),
		asm.Mov.Reg(cur, next),

		// UDP: whole header present, destination port matches.
		asm.Mov.Reg(next, cur).WithSymbol("udp"),
		asm.Add.Imm(next, 8),
		asm.JGT.Reg(next, end, "pass"),
		asm.LoadMem(asm.R1, cur, 2, asm.Half),
		asm.JNE.Imm(asm.R1, be16(port), "pass"),

		// With the filter on (filter[0] != 0), the destination must be one
		// of addrs; otherwise the frame is another host's business (another
		// RoCE stack on this interface, or the kernel's).
		asm.StoreImm(asm.RFP, stackKey, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackKey),
		asm.LoadMapPtr(asm.R1, 0).WithReference("filter"),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "redirect"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "redirect"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackAddr),
		asm.LoadMapPtr(asm.R1, 0).WithReference("addrs"),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "redirect"),
		asm.Mov.Imm(ret, xdpPass),
		asm.Mov.Imm(asm.R1, statOtherAddr),
		asm.Ja.Label("count"),

		// bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS): an empty
		// slot yields XDP_PASS.
		asm.LoadMem(asm.R2, ctx, mdRxQueueIndex, asm.Word).WithSymbol("redirect"),
		asm.LoadMapPtr(asm.R1, 0).WithReference("xsks"),
		asm.Mov.Imm(asm.R3, xdpPass),
		asm.FnRedirectMap.Call(),
		asm.Mov.Reg(ret, asm.R0),
		asm.Mov.Imm(asm.R1, statNoSocket),
		asm.JNE.Imm(asm.R0, xdpRedirect, "count"),
		asm.Mov.Imm(asm.R1, statRedirected),
		asm.Ja.Label("count"),

		asm.Mov.Imm(ret, xdpPass).WithSymbol("pass"),
		asm.Mov.Imm(asm.R1, statPassed),

		// stats[R1]++ (per-CPU, so a plain add).
		asm.StoreMem(asm.RFP, stackKey, asm.R1, asm.Word).WithSymbol("count"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackKey),
		asm.LoadMapPtr(asm.R1, 0).WithReference("stats"),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R0, ret).WithSymbol("out"),
		asm.Return(),
	)
	var flags uint32
	if frags {
		flags = unix.BPF_F_XDP_HAS_FRAGS
	}
	return &ebpf.ProgramSpec{
		Name:         "goroce_steer",
		Type:         ebpf.XDP,
		AttachType:   ebpf.AttachXDP,
		Flags:        flags,
		License:      "Apache-2.0",
		Instructions: insns,
	}
}

// Options returns the options the program was loaded with, defaults filled in.
func (p *Program) Options() Options { return p.opts }

// FD returns the program's file descriptor (valid until Close).
func (p *Program) FD() int { return p.prog.FD() }

// ID returns the kernel's id of the program.
func (p *Program) ID() (uint32, error) {
	info, err := p.prog.Info()
	if err != nil {
		return 0, err
	}
	id, _ := info.ID()
	return uint32(id), nil
}

func (p *Program) checkQueue(queue int) error {
	if queue < 0 || queue >= p.opts.Queues {
		return fmt.Errorf("%w: queue %d, XSKMAP has %d entries (Options.Queues)", ErrQueueRange, queue, p.opts.Queues)
	}
	return nil
}

// Register steers RX queue queue to the AF_XDP socket xskFD, which must be
// bound to that queue of the interface the program is attached to.
func (p *Program) Register(queue int, xskFD int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.checkQueue(queue); err != nil {
		return err
	}
	if xskFD < 0 {
		return fmt.Errorf("bpf: register queue %d: invalid socket fd %d", queue, xskFD)
	}
	if err := p.xsks.Update(uint32(queue), uint32(xskFD), ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("bpf: register queue %d: fd %d is not a bound AF_XDP socket with an RX ring: %w", queue, xskFD, err)
		}
		return fmt.Errorf("bpf: register queue %d: %w", queue, err)
	}
	return nil
}

// Unregister stops steering RX queue queue; its frames go to the kernel
// stack again. Unregistering an empty slot is not an error.
func (p *Program) Unregister(queue int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.checkQueue(queue); err != nil {
		return err
	}
	if err := p.xsks.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: unregister queue %d: %w", queue, err)
	}
	return nil
}

// SetLocalAddrs makes the program steer only frames addressed to one of
// addrs (an IPv4 address also matches in its IPv4-mapped IPv6 form);
// frames to any other address pass to the kernel and count as OtherAddr.
// A device keeps this in step with its GID table, so that another RoCE
// stack on the same interface (rdma_rxe, or a goroce device on the kernel
// UDP link bound to another address) still gets its own frames. Until the
// first call the program steers every frame to the RoCEv2 port. The
// update adds before it removes, so a frame to an address served both
// before and after is never passed.
func (p *Program) SetLocalAddrs(addrs []netip.Addr) error {
	want := make(map[[16]byte]bool, len(addrs))
	for _, a := range addrs {
		if !a.IsValid() {
			return fmt.Errorf("%w: invalid address", ErrAddr)
		}
		want[a.Unmap().As16()] = true
	}
	if len(want) > MaxAddrs {
		return fmt.Errorf("%w: %d addresses, at most %d", ErrAddr, len(want), MaxAddrs)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	for k := range want {
		if err := p.addrs.Update(k, uint32(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("bpf: add address %v: %w", netip.AddrFrom16(k).Unmap(), err)
		}
	}
	var stale [][16]byte
	var k [16]byte
	var v uint32
	it := p.addrs.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bpf: list addresses: %w", err)
	}
	for _, k := range stale {
		if err := p.addrs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("bpf: remove address %v: %w", netip.AddrFrom16(k).Unmap(), err)
		}
	}
	if err := p.filter.Update(uint32(0), uint32(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: turn the address filter on: %w", err)
	}
	return nil
}

// LocalAddrs returns the addresses set by SetLocalAddrs and whether the
// filter is on (false: every frame to the port is steered).
func (p *Program) LocalAddrs() ([]netip.Addr, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false, ErrClosed
	}
	var on uint32
	if err := p.filter.Lookup(uint32(0), &on); err != nil {
		return nil, false, fmt.Errorf("bpf: read the address filter: %w", err)
	}
	var out []netip.Addr
	var k [16]byte
	var v uint32
	it := p.addrs.Iterate()
	for it.Next(&k, &v) {
		out = append(out, netip.AddrFrom16(k).Unmap())
	}
	if err := it.Err(); err != nil {
		return nil, false, fmt.Errorf("bpf: list addresses: %w", err)
	}
	return out, on != 0, nil
}

// Stats returns the decision counters summed over all CPUs.
func (p *Program) Stats() (Stats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Stats{}, ErrClosed
	}
	var s Stats
	var perCPU []uint64
	for i, dst := range []*uint64{&s.Redirected, &s.NoSocket, &s.Passed, &s.OtherAddr} {
		if err := p.stats.Lookup(uint32(i), &perCPU); err != nil {
			return Stats{}, fmt.Errorf("bpf: read stats: %w", err)
		}
		for _, v := range perCPU {
			*dst += v
		}
	}
	return s, nil
}

// Close detaches every Attachment made from p and releases the program and
// its maps. Closing again is a no-op.
func (p *Program) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	atts := make([]*Attachment, 0, len(p.attachments))
	for a := range p.attachments {
		atts = append(atts, a)
	}
	p.mu.Unlock()
	var errs []error
	for _, a := range atts {
		errs = append(errs, a.Close())
	}
	errs = append(errs, p.prog.Close(), p.xsks.Close(), p.stats.Close(), p.addrs.Close(), p.filter.Close())
	return errors.Join(errs...)
}
