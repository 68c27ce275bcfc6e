package perfrun

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestShardsLimit: the command line's limit on --shards is the device's.
func TestShardsLimit(t *testing.T) {
	for _, n := range []int{cliflag.MaxShards, cliflag.MaxShards + 1} {
		la, _ := memlink.PairWithOptions(memlink.Options{})
		d, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Shards: n})
		if err == nil {
			d.Close()
		}
		if (err == nil) != (n <= cliflag.MaxShards) {
			t.Errorf("Shards %d: %v", n, err)
		}
	}
}
