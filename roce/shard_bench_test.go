//go:build linux

package roce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/xdp"
)

// BenchmarkWritePairs moves RDMA WRITEs over QP pairs between two devices
// on kernel UDP sockets on loopback, each pair posted and reaped by its own
// goroutine, with the devices' transmit shards (Options.Shards) at 1 and
// 2: what the shards buy where two goroutines transmit at once. Compare
// the pairs=2 rows between shards, and each against pairs=1, at
// -cpu 1,2.
func BenchmarkWritePairs(b *testing.B) {
	for _, shards := range []int{1, 2} {
		for _, pairs := range []int{1, 2} {
			for _, size := range []int{64, 4096} {
				b.Run(fmt.Sprintf("shards=%d/pairs=%d/size=%d", shards, pairs, size), func(b *testing.B) {
					da, db := udpPairWith(b, Options{Shards: shards})
					benchWritePairs(b, da, db, loA, loB, pairs, size)
				})
			}
		}
	}
}

// BenchmarkWritePairsXDPQueues is BenchmarkWritePairs over AF_XDP links of
// two queues on a two-queue veth: with two shards each shard sends on a
// socket of its own (link.TxQueues), with one every frame leaves by the
// first queue's.
func BenchmarkWritePairsXDPQueues(b *testing.B) {
	for _, shards := range []int{1, 2} {
		for _, size := range []int{64, 4096} {
			b.Run(fmt.Sprintf("shards=%d/pairs=2/size=%d", shards, size), func(b *testing.B) {
				netnstest.RequireCaps(b, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
				p := netnstest.NewPairConfig(b, netnstest.VethConfig{MTU: 1500, Queues: 2,
					Addr: netip.MustParsePrefix("10.99.0.1/24"), PeerAddr: netip.MustParsePrefix("10.99.0.2/24")})
				var devs [2]*Device
				for i, v := range []*netnstest.Veth{p.VethA, p.VethB} {
					if err := v.WaitReady(5 * time.Second); err != nil {
						b.Fatal(err)
					}
					err := v.NS.Do(func() error {
						l, err := xdplink.Open(v.Name, xdplink.Options{Queues: []int{0, 1}, NumFrames: 4096})
						if err != nil {
							return err
						}
						if devs[i], err = OpenFollowing(l, v.Name, Options{Shards: shards}); err != nil {
							l.Close()
						}
						return err
					})
					if errors.Is(err, xdp.ErrNotSupported) {
						b.Skipf("AF_XDP unavailable: %v", err)
					}
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { devs[i].Close() })
				}
				benchWritePairs(b, devs[0], devs[1], p.VethA.Addr.Addr(), p.VethB.Addr.Addr(), 2, size)
			})
		}
	}
}

func benchWritePairs(b *testing.B, da, db *Device, addrA, addrB netip.Addr, pairs, size int) {
	const window, signal = 64, 16
	type pair struct{ a, t *endpoint }
	ps := make([]pair, pairs)
	for i := range ps {
		ps[i] = pair{newEndpoint(b, da, RC, size), newEndpoint(b, db, RC, size)}
		connect(b, ps[i].a, ps[i].t, addrA, addrB, ConnectAttr{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.SetBytes(int64(size))
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, pairs)
	for i := range ps {
		n := b.N / pairs
		if i < b.N%pairs {
			n++
		}
		wg.Add(1)
		go func(p pair, n int) {
			defer wg.Done()
			var wc [8]WorkCompletion
			wr := SendWR{Opcode: WRRDMAWrite, SGL: []SGE{p.a.mr.SGE(0, size)}, RemoteAddr: p.t.mr.Addr(), RKey: p.t.mr.RKey()}
			posted, done := 0, 0
			for done < n {
				for posted < n && posted-done < window {
					wr.ID = uint64(posted)
					wr.Flags = 0
					if posted%signal == signal-1 || posted == n-1 {
						wr.Flags = SendSignaled
					}
					if err := p.a.qp.PostSend(&wr); err != nil {
						errs <- err
						return
					}
					posted++
				}
				k := p.a.scq.Poll(wc[:])
				if k == 0 {
					if err := p.a.scq.Wait(ctx); err != nil {
						errs <- err
						return
					}
					continue
				}
				for _, c := range wc[:k] {
					if c.Status != WCSuccess {
						errs <- fmt.Errorf("completion %v", c.Status)
						return
					}
					done = int(c.WRID) + 1
				}
			}
		}(ps[i], n)
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
