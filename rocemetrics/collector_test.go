package rocemetrics_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rocemetrics"
)

func TestCollector(t *testing.T) {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	a4, b4 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a4}, Neighbours: map[netip.Addr]net.HardwareAddr{b4: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b4}, Neighbours: map[netip.Addr]net.HardwareAddr{a4: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(rocemetrics.New(da, "mem0")); err != nil {
		t.Fatal(err)
	}
	// Some traffic: a UD datagram to a QP that does not exist on b.
	pd, _ := da.AllocPD()
	cq, _ := da.CreateCQ(8)
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := q.Connect(ctx, &roce.ConnectAttr{QKey: 1}); err != nil {
		t.Fatal(err)
	}
	ah, err := pd.CreateAH(ctx, roce.AddressVector{DGID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.PostSend(&roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendInline | roce.SendSignaled, Inline: []byte("hi"),
		AH: ah, RemoteQPN: 99, RemoteQKey: 1}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != len(roce.CounterNames)+4 {
		t.Fatalf("%d metrics (%v), want %d", n, err, len(roce.CounterNames)+4)
	}
	want := `
# HELP roce_sent_pkts_total Frames handed to the link.
# TYPE roce_sent_pkts_total counter
roce_sent_pkts_total{device="mem0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "roce_sent_pkts_total"); err != nil {
		t.Fatal(err)
	}
}
