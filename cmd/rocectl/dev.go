package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

func init() {
	register("dev", command{
		summary: "show devices, port attributes and GID tables (ibv_devinfo, show_gids)",
		run:     runDev,
	})
}

// Identity values goroce reports as rxe does (drivers/infiniband/sw/rxe:
// RXE_VENDOR_ID, no firmware, hardware version 0), so tools comparing the
// two see the same device description.
const (
	devVendorID     = 0xFFFFFF
	devVendorPartID = 0
	devHWVersion    = 0
	devFWVersion    = "0.0.0"
)

// runDev prints the device and port attributes and the GID table.
// Equivalent to: `ibv_devinfo [-d $dev] [-v]` and `show_gids`.
func runDev(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ifname := fs.String("d", "", "network `interface` (default: every Ethernet interface)")
	verbose := fs.Bool("v", false, "also print the GID table, as show_gids does")
	jsonOut := fs.Bool("j", false, "JSON output: an array with one object per device, GID table included")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: rocectl dev [-d IFACE] [-v] [-j]

Mirrors ibv_devinfo (and show_gids with -v) for the goroce device of each
interface: a device is named after its interface (hca_id). The device is
opened read-only: no XDP program, no socket, nothing sent; the GID table and
port attributes come from the same code a running device uses (package
roce), fed by the interface's addresses and MTU. GID index 0 is
fe80::EUI-64(MAC), then one RoCE v2 GID per address (IPv4 as ::ffff:a.b.c.d,
then IPv6); active_mtu is the largest IB MTU not above the netdev MTU - 80,
as rxe computes it. The port is PORT_DOWN while the interface has no carrier.

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
		fmt.Fprintf(stderr, "rocectl dev: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var ifs []net.Interface
	if *ifname != "" {
		ifi, err := net.InterfaceByName(*ifname)
		if err != nil {
			fmt.Fprintf(stderr, "rocectl dev: %v\n", err)
			return 1
		}
		ifs = []net.Interface{*ifi}
	} else {
		all, err := net.Interfaces()
		if err != nil {
			fmt.Fprintf(stderr, "rocectl dev: %v\n", err)
			return 1
		}
		for _, ifi := range all {
			if len(ifi.HardwareAddr) == 6 && ifi.Flags&net.FlagLoopback == 0 {
				ifs = append(ifs, ifi)
			}
		}
		if len(ifs) == 0 {
			fmt.Fprintln(stderr, "rocectl dev: no Ethernet interfaces")
			return 1
		}
	}
	status := 0
	js := []devJSON{}
	for _, ifi := range ifs {
		v, err := queryDevice(ifi)
		if err != nil {
			fmt.Fprintf(stderr, "rocectl dev: %s: %v\n", ifi.Name, err)
			status = 1
			continue
		}
		if *jsonOut {
			js = append(js, v.json())
			continue
		}
		writeDevInfo(stdout, v, *verbose)
		if *verbose {
			writeGIDs(stdout, v)
		}
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(js); err != nil {
			fmt.Fprintf(stderr, "rocectl dev: %v\n", err)
			return 1
		}
	}
	return status
}

// devView is what dev prints about one device.
type devView struct {
	Info roce.DeviceInfo
	Port roce.PortAttr
	GIDs []roce.GIDEntry
}

// devJSON is one device in dev -j, with ibv_devinfo's field names.
type devJSON struct {
	HCAID        string     `json:"hca_id"`
	Transport    string     `json:"transport"`
	FWVer        string     `json:"fw_ver"`
	NodeGUID     string     `json:"node_guid"`
	SysImageGUID string     `json:"sys_image_guid"`
	VendorID     uint32     `json:"vendor_id"`
	VendorPartID uint32     `json:"vendor_part_id"`
	HWVer        uint32     `json:"hw_ver"`
	PhysPortCnt  int        `json:"phys_port_cnt"`
	Ports        []portJSON `json:"ports"`
}

type portJSON struct {
	Port       int       `json:"port"`
	State      string    `json:"state"`
	MaxMTU     int       `json:"max_mtu"`
	ActiveMTU  int       `json:"active_mtu"`
	LinkLayer  string    `json:"link_layer"`
	Netdev     string    `json:"netdev"`
	NetdevMTU  int       `json:"netdev_mtu"`
	GIDTblLen  int       `json:"gid_tbl_len"`
	MaxMsgSize uint32    `json:"max_msg_sz"`
	GIDs       []gidJSON `json:"gids"`
}

type gidJSON struct {
	Index int    `json:"index"`
	GID   string `json:"gid"`
	IPv4  string `json:"ipv4,omitempty"`
	Type  string `json:"type"`
}

func (v devView) json() devJSON {
	p := v.Port
	pj := portJSON{
		Port: 1, State: portStateName(p.State), MaxMTU: mtuBytes(p.MaxMTU), ActiveMTU: mtuBytes(p.ActiveMTU),
		LinkLayer: p.LinkLayer, Netdev: v.Info.Name, NetdevMTU: p.NetdevMTU, GIDTblLen: p.GIDTableLen,
		MaxMsgSize: p.MaxMsgSize, GIDs: []gidJSON{},
	}
	for _, e := range v.GIDs {
		g := gidJSON{Index: e.Index, GID: netip.AddrFrom16(e.GID).String(), Type: e.Type.String()}
		if e.Addr.Is4() || e.Addr.Is4In6() {
			g.IPv4 = e.Addr.Unmap().String()
		}
		pj.GIDs = append(pj.GIDs, g)
	}
	guid := guidString(v.Info.NodeGUID)
	return devJSON{
		HCAID: v.Info.Name, Transport: "InfiniBand", FWVer: devFWVersion, NodeGUID: guid, SysImageGUID: guid,
		VendorID: devVendorID, VendorPartID: devVendorPartID, HWVer: devHWVersion, PhysPortCnt: 1,
		Ports: []portJSON{pj},
	}
}

// queryDevice opens a device on ifi over a link that carries nothing,
// reads its description and closes it.
func queryDevice(ifi net.Interface) (devView, error) {
	ql := newQueryLink(ifi)
	d, err := netdev.OpenLink(ql, ifi.Name, roce.Options{
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		TxBatch: 1,
	})
	if err != nil {
		return devView{}, err
	}
	defer d.Close()
	v := devView{Info: d.Info(), Port: d.QueryPort(), GIDs: d.GIDs()}
	v.Info.Name = ifi.Name
	// rxe reports the port down without carrier; roce only knows whether
	// the device is open.
	if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagRunning == 0 {
		v.Port.State = roce.PortDown
	}
	return v, nil
}

// queryLink is a link.Link that never delivers or sends a frame: enough for
// a device whose description is wanted, and harmless next to a device of
// another process on the same interface.
type queryLink struct {
	ifi    net.Interface
	done   chan struct{}
	closer sync.Once
}

// errQueryOnly refuses sends on a query link.
var errQueryOnly = errors.New("rocectl: device opened read-only")

func newQueryLink(ifi net.Interface) *queryLink {
	return &queryLink{ifi: ifi, done: make(chan struct{})}
}

func (l *queryLink) ReadBatch(ctx context.Context, fn func([][]byte)) (int, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-l.done:
		return 0, link.ErrClosed
	}
}

func (l *queryLink) WriteBatch(frames [][]byte) (int, error) {
	if len(frames) == 0 {
		return 0, nil
	}
	return 0, &link.FrameError{Index: 0, Err: errQueryOnly}
}

func (l *queryLink) MTU() int { return l.ifi.MTU }

func (l *queryLink) HardwareAddr() net.HardwareAddr {
	if len(l.ifi.HardwareAddr) == 6 {
		return l.ifi.HardwareAddr
	}
	return make(net.HardwareAddr, 6)
}

func (l *queryLink) Info() link.Info { return link.Info{Kind: "query", Name: l.ifi.Name} }

func (l *queryLink) Close() error {
	l.closer.Do(func() { close(l.done) })
	return nil
}

// guidString formats a GUID as ibv_devinfo does: four groups of four hex
// digits.
func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xFFFF, g>>16&0xFFFF, g&0xFFFF)
}

// mtuBytes is the size of an IB MTU code.
func mtuBytes(m ib.MTU) int {
	if m < ib.MTU256 || m > ib.MTU4096 {
		return 0
	}
	return 128 << m
}

func portStateName(s roce.PortState) string {
	switch s {
	case roce.PortActive:
		return "PORT_ACTIVE"
	case roce.PortDown:
		return "PORT_DOWN"
	}
	return "PORT_" + strings.ToUpper(s.String())
}

func writeDevInfo(w io.Writer, v devView, verbose bool) {
	p := v.Port
	fmt.Fprintf(w, "hca_id:\t%s\n", v.Info.Name)
	fmt.Fprintf(w, "\ttransport:\t\t\tInfiniBand (0)\n")
	fmt.Fprintf(w, "\tfw_ver:\t\t\t\t%s\n", devFWVersion)
	fmt.Fprintf(w, "\tnode_guid:\t\t\t%s\n", guidString(v.Info.NodeGUID))
	// rxe uses the node GUID as the system image GUID.
	fmt.Fprintf(w, "\tsys_image_guid:\t\t\t%s\n", guidString(v.Info.NodeGUID))
	fmt.Fprintf(w, "\tvendor_id:\t\t\t0x%04x\n", devVendorID)
	fmt.Fprintf(w, "\tvendor_part_id:\t\t\t%d\n", devVendorPartID)
	fmt.Fprintf(w, "\thw_ver:\t\t\t\t0x%x\n", devHWVersion)
	fmt.Fprintf(w, "\tphys_port_cnt:\t\t\t1\n")
	fmt.Fprintf(w, "\t\tport:\t1\n")
	fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s (%d)\n", portStateName(p.State), p.State)
	fmt.Fprintf(w, "\t\t\tmax_mtu:\t\t%d (%d)\n", mtuBytes(p.MaxMTU), p.MaxMTU)
	fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d (%d)\n", mtuBytes(p.ActiveMTU), p.ActiveMTU)
	fmt.Fprintf(w, "\t\t\tsm_lid:\t\t\t0\n")
	fmt.Fprintf(w, "\t\t\tport_lid:\t\t0\n")
	fmt.Fprintf(w, "\t\t\tport_lmc:\t\t0x00\n")
	fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
	if verbose {
		fmt.Fprintf(w, "\t\t\tnetdev:\t\t\t%s (mtu %d)\n", v.Info.Name, p.NetdevMTU)
		fmt.Fprintf(w, "\t\t\tmax_msg_sz:\t\t0x%x\n", p.MaxMsgSize)
		fmt.Fprintf(w, "\t\t\tgid_tbl_len:\t\t%d\n", p.GIDTableLen)
		fmt.Fprintf(w, "\t\t\tpkey_tbl_len:\t\t%d\n", p.PKeyTableLen)
		for _, e := range v.GIDs {
			fmt.Fprintf(w, "\t\t\tGID[%3d]:\t\t%s, %v\n", e.Index, netip.AddrFrom16(e.GID), e.Type)
		}
	}
	fmt.Fprintln(w)
}

// gidHex writes a GID as show_gids does: eight groups of four hex digits.
func gidHex(g ib.GID) string {
	var b strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x%02x", g[i], g[i+1])
	}
	return b.String()
}

func writeGIDs(w io.Writer, v devView) {
	tw := tabwriter.NewWriter(w, 0, 8, 1, '\t', 0)
	fmt.Fprintln(tw, "DEV\tPORT\tINDEX\tGID\tIPv4\tVER\tDEV")
	fmt.Fprintln(tw, "---\t----\t-----\t---\t------------\t---\t---")
	for _, e := range v.GIDs {
		v4 := ""
		if e.Addr.Is4() || e.Addr.Is4In6() {
			v4 = e.Addr.Unmap().String()
		}
		fmt.Fprintf(tw, "%s\t1\t%d\t%s\t%s\tv%d\t%s\n", v.Info.Name, e.Index, gidHex(e.GID), v4, e.Type, v.Info.Name)
	}
	tw.Flush()
	fmt.Fprintf(w, "n_gids_found=%d\n\n", len(v.GIDs))
}
