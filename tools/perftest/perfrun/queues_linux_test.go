package perfrun

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// TestQueuesLimit: the command line's limit on --queues is the UDP
// link's.
func TestQueuesLimit(t *testing.T) {
	if cliflag.MaxQueues != udplink.MaxQueues {
		t.Fatalf("cliflag.MaxQueues %d, udplink.MaxQueues %d", cliflag.MaxQueues, udplink.MaxQueues)
	}
}

// perf --loopback --queues runs on links of that many receive queues,
// and -q spreads the QPs over all of them.
func TestLoopbackQueues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := PerfConfig{Verb: perftest.Send, Size: 64, Iters: 500, NumQPs: 4, GIDIndex: -1, Queues: 2, Shards: 2}
	var out bytes.Buffer
	var links []*udplink.Link
	stats := func(d *roce.Device, _ bool) (func(), error) {
		l := d.Link().(*udplink.Link)
		links = append(links, l)
		return func() {
			for i, n := range l.Stats().QueueBuffers {
				if n == 0 {
					t.Errorf("%v: queue %d received nothing", l.LocalAddr(), i)
				}
			}
		}, nil
	}
	client, server, err := loopback(ctx, cfg, &out, false, stats)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(links) != 2 || len(links[0].RxQueues()) != 2 {
		t.Fatalf("links %v", links)
	}
	if len(client) == 0 || client[0].Iters != 2000 || len(server) == 0 || server[0].Iters != 2000 || server[0].DataErrors != 0 {
		t.Fatalf("client %+v server %+v\n%s", client, server, out.String())
	}
}
