package roce

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
)

// gidTableLen is the size rxe advertises (RXE_PORT_GID_TBL_LEN).
const gidTableLen = 1024

// GIDType is the type of a GID table entry. This device, like rxe, has only
// RoCEv2 entries.
type GIDType uint8

// GID types.
const (
	GIDTypeRoCEv2 GIDType = 2
)

func (t GIDType) String() string {
	if t == GIDTypeRoCEv2 {
		return "RoCE v2"
	}
	return fmt.Sprintf("GIDType(%d)", uint8(t))
}

// GIDEntry is one populated slot of the GID table.
type GIDEntry struct {
	Index int
	GID   ib.GID
	Type  GIDType
	// Addr is the IP address the GID stands for (the link-local address
	// derived from the MAC for the default GID at index 0).
	Addr netip.Addr
}

// gidTable is an immutable snapshot; updates replace it (copy on write), so
// the data path reads it without a lock.
type gidTable struct {
	slots []ib.GID // index → GID; zero GID = empty slot
	index map[ib.GID]int
	v4    netip.Addr // default source address per family
	v6    netip.Addr
}

// buildGIDTable lays out the table like the kernel's RoCE GID cache for rxe:
// index 0 the default GID fe80::EUI-64(MAC), then one entry per address
// (IPv4 as ::ffff:a.b.c.d). Addresses that stay keep their index when others
// come and go, and a new address takes the lowest free slot.
func buildGIDTable(old *gidTable, mac [6]byte, addrs []netip.Addr) *gidTable {
	t := &gidTable{index: make(map[ib.GID]int)}
	def := defaultGID(mac)
	want := make(map[ib.GID]bool, len(addrs)+1)
	want[def] = true
	for _, a := range addrs {
		want[ib.GIDFromAddr(a)] = true
	}
	t.slots = append(t.slots, def)
	t.index[def] = 0
	if old != nil {
		for i, g := range old.slots {
			if i == 0 {
				continue
			}
			for len(t.slots) <= i {
				t.slots = append(t.slots, ib.GID{})
			}
			if g != (ib.GID{}) && want[g] {
				if _, dup := t.index[g]; !dup {
					t.slots[i] = g
					t.index[g] = i
				}
			}
		}
	}
	for _, a := range addrs {
		g := ib.GIDFromAddr(a)
		if _, ok := t.index[g]; ok {
			continue
		}
		i := 1
		for i < len(t.slots) && t.slots[i] != (ib.GID{}) {
			i++
		}
		if i >= gidTableLen {
			break
		}
		if i == len(t.slots) {
			t.slots = append(t.slots, g)
		} else {
			t.slots[i] = g
		}
		t.index[g] = i
	}
	for len(t.slots) > 1 && t.slots[len(t.slots)-1] == (ib.GID{}) {
		t.slots = t.slots[:len(t.slots)-1]
	}
	// Default sources: the lowest-index address of each family, preferring
	// global IPv6 over link-local.
	for _, g := range t.slots[1:] {
		if g == (ib.GID{}) {
			continue
		}
		a := g.Addr()
		if a.Is4() {
			if !t.v4.IsValid() {
				t.v4 = a
			}
		} else if !t.v6.IsValid() || (t.v6.IsLinkLocalUnicast() && !a.IsLinkLocalUnicast()) {
			t.v6 = a
		}
	}
	if !t.v6.IsValid() {
		t.v6 = def.Addr()
	}
	return t
}

// servedAddrs returns the addresses of addrs the device's link can send
// from (link.AddrServer), in their order; all of them for a link that
// serves every address.
func (d *Device) servedAddrs(addrs []netip.Addr) []netip.Addr {
	s, ok := d.link.(link.AddrServer)
	if !ok {
		return addrs
	}
	out := make([]netip.Addr, 0, len(addrs)+1)
	for _, a := range addrs {
		if s.ServesAddr(a) {
			out = append(out, a)
		}
	}
	// A link bound to one address serves it even where the interface
	// does not list it: any 127.0.0.x on lo, so that two processes on one
	// host each bind their own.
	if b, ok := d.link.(interface{ LocalAddr() netip.AddrPort }); ok {
		if a := b.LocalAddr().Addr().Unmap(); a.IsValid() && !a.IsUnspecified() && s.ServesAddr(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// defaultGID is fe80::EUI-64(MAC) (rdma core: make_default_gid).
func defaultGID(mac [6]byte) ib.GID {
	var g ib.GID
	g[0], g[1] = 0xfe, 0x80
	g[8], g[9], g[10], g[11] = mac[0]^2, mac[1], mac[2], 0xFF
	g[12], g[13], g[14], g[15] = 0xFE, mac[3], mac[4], mac[5]
	return g
}

func (t *gidTable) has(g ib.GID) bool {
	_, ok := t.index[g]
	return ok
}

func (t *gidTable) defaultSource(v4 bool) netip.Addr {
	if v4 {
		return t.v4
	}
	return t.v6
}

// GID returns the GID at index (ibv_query_gid). An empty slot gives ErrNoGID.
func (d *Device) GID(index int) (ib.GID, error) {
	t := d.gids.Load()
	if index < 0 || index >= len(t.slots) || t.slots[index] == (ib.GID{}) {
		return ib.GID{}, fmt.Errorf("roce: GID index %d: %w", index, ErrNoGID)
	}
	return t.slots[index], nil
}

// QueryGID is GID under its ibverbs name.
func (d *Device) QueryGID(index int) (ib.GID, error) { return d.GID(index) }

// setGIDTable publishes t and tells a link that filters by destination
// address (link.AddrFilter: the AF_XDP steering program) which addresses
// are now the device's, so frames to the interface's other addresses stay
// with the kernel and whatever else runs RoCE there.
func (d *Device) setGIDTable(t *gidTable) error {
	d.gids.Store(t)
	f, ok := d.link.(link.AddrFilter)
	if !ok {
		return nil
	}
	addrs := make([]netip.Addr, 0, len(t.index))
	for g := range t.index {
		addrs = append(addrs, g.Addr())
	}
	if err := f.SetLocalAddrs(addrs); err != nil {
		return fmt.Errorf("roce: address filter of the link: %w", err)
	}
	return nil
}

// GIDs returns the populated entries of the GID table in index order.
func (d *Device) GIDs() []GIDEntry {
	t := d.gids.Load()
	var out []GIDEntry
	for i, g := range t.slots {
		if g == (ib.GID{}) {
			continue
		}
		out = append(out, GIDEntry{Index: i, GID: g, Type: GIDTypeRoCEv2, Addr: g.Addr()})
	}
	return out
}

// GIDIndex returns the index of the GID for addr.
func (d *Device) GIDIndex(addr netip.Addr) (int, error) {
	t := d.gids.Load()
	if i, ok := t.index[ib.GIDFromAddr(addr)]; ok {
		return i, nil
	}
	return 0, fmt.Errorf("roce: %v: %w", addr, ErrNoGID)
}

// SourceGID returns the GID the device sends from when talking to dst: the
// first address of dst's family in the GID table.
func (d *Device) SourceGID(dst netip.Addr) (ib.GID, error) {
	a := d.gids.Load().defaultSource(dst.Unmap().Is4())
	if !a.IsValid() {
		return ib.GID{}, fmt.Errorf("roce: no %s address for %v: %w", family(dst), dst, ErrNoAddress)
	}
	return ib.GIDFromAddr(a), nil
}

func family(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "IPv4"
	}
	return "IPv6"
}
