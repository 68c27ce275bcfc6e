package cuobj

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// Multipath (rdma_multipath_enabled): a client has one rail per device,
// the primary first, then its backups (ClientOptions.Backups, ordered by
// rdma_dev_addr_list when that is set, at most rdma_max_backup_devices).
// Each registration is registered on every rail and each rail listens
// (RC) or has a DCT (DC) of its own, so a token can name any of them.
//
// Every callback attempt takes the current rail. A rail stops being
// chosen when its port is down (the device follows the interface's
// operational state through netlink; with rdma_async_event_monitoring
// its port error event marks the rail at once) or after rdma_unhealthy_threshold consecutive failed attempts; the
// retry of a retryable failure (rdma_io_retry_count, each after
// rdma_io_retry_delay_ms) then goes to the first healthy rail in order:
// a failover. A health check every rdma_health_check_interval_ms brings
// a rail back once its port has been up for rdma_failback_delay_ms; with
// rdma_failback_enabled the client then moves back to it if it comes
// before the current rail (a failback), otherwise it stays where it is.
//
// A request the server had already posted when the client's path died
// fails only when the server's QP gives up: goroce's QPs, like rxe's, read
// the server's default retry_cnt of 7 as "retry for ever", so such a
// request then ends with its context (a client that ends the connection
// with a DREQ has it flushed within a second); a server of multipath clients sets
// Tunables.RetryCount to 6 or less to have it fail with
// IBV_WC_RETRY_EXC_ERR, which the client retries on another device.

// rail is one client device.
type rail struct {
	idx      int
	dev      *roce.Device
	addr     netip.AddrPort
	gid      ib.GID
	endpoint uint32
	pd       *roce.PD
	ln       *cm.Listener // RC
	lnOnce   sync.Once
	dct      *dcTarget // DC

	fails   atomic.Uint32 // consecutive failed attempts
	down    atomic.Bool   // unhealthy: chosen only when no rail is healthy
	upSince atomic.Int64  // when the health check first saw the port up again (Unix ns), 0: not yet
}

func (r *rail) portUp() bool { return r.dev.QueryPort().State == roce.PortActive }

func (r *rail) healthy() bool { return !r.down.Load() && r.portUp() }

// pick returns the rail for the next attempt: the current one while it is
// healthy, else the first healthy rail in order (a failover), else the
// current one (every rail is down; the attempt fails and is retried).
func (c *Client) pick() *rail {
	cur := c.rails[c.cur.Load()]
	if cur.healthy() {
		return cur
	}
	for _, r := range c.rails {
		if r.healthy() {
			if c.cur.CompareAndSwap(int32(cur.idx), int32(r.idx)) {
				c.stats.Failovers.Add(1)
				c.telem.error("failover", "from", cur.addr, "to", r.addr)
			}
			return c.rails[c.cur.Load()]
		}
	}
	return cur
}

// attempted accounts for one callback attempt on r.
func (c *Client) attempted(r *rail, err error) {
	if err == nil {
		r.fails.Store(0)
		return
	}
	if n := r.fails.Add(1); (n >= uint32(c.cfg.Properties.UnhealthyThreshold) || !r.portUp()) && len(c.rails) > 1 {
		c.markDown(r, "failed attempts", n)
	}
}

func (c *Client) markDown(r *rail, why string, n uint32) {
	r.upSince.Store(0)
	if !r.down.Swap(true) {
		c.telem.error("device unhealthy", "addr", r.addr, "reason", why, "failures", n)
	}
}

// health runs the health check of a multipath client.
func (c *Client) health() {
	defer c.wg.Done()
	p := c.cfg.Properties
	t := time.NewTicker(time.Duration(p.HealthCheckInterval) * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case now := <-t.C:
			c.checkRails(now)
		}
	}
}

func (c *Client) checkRails(now time.Time) {
	p := c.cfg.Properties
	for _, r := range c.rails {
		if !r.portUp() {
			c.markDown(r, "port down", r.fails.Load())
			continue
		}
		if !r.down.Load() {
			continue
		}
		since := r.upSince.Load()
		if since == 0 {
			r.upSince.Store(now.UnixNano())
			continue
		}
		if now.Sub(time.Unix(0, since)) < time.Duration(p.FailbackDelayMS)*time.Millisecond {
			continue
		}
		r.fails.Store(0)
		r.down.Store(false)
		c.telem.info("device healthy again", "addr", r.addr)
		if !p.FailbackEnabled {
			continue
		}
		for {
			cur := c.cur.Load()
			if int(cur) <= r.idx && c.rails[cur].healthy() {
				break
			}
			if c.cur.CompareAndSwap(cur, int32(r.idx)) {
				c.stats.Failbacks.Add(1)
				c.telem.error("failback", "from", c.rails[cur].addr, "to", r.addr)
				break
			}
		}
	}
}

// monitor marks r down on its device's port error events
// (rdma_async_event_monitoring); the health check brings it back.
func (c *Client) monitor(r *rail, events <-chan roce.AsyncEvent) {
	defer c.wg.Done()
	for ev := range events {
		if ev.Type == roce.EventPortErr {
			c.markDown(r, "port error event", r.fails.Load())
		}
	}
}

// orderRails returns the client's devices in rail order: dev and
// backups, ordered and selected by rdma_dev_addr_list when it is set,
// with the address each rail uses (invalid: the device's first), at most
// 1 + rdma_max_backup_devices of them, only dev's without multipath.
func (c *Client) orderRails(dev *roce.Device, backups []*roce.Device, primary netip.Addr) ([]*roce.Device, []netip.Addr, error) {
	p := c.cfg.Properties
	devs := append([]*roce.Device{dev}, backups...)
	addrs := make([]netip.Addr, len(devs))
	addrs[0] = primary
	if len(p.DevAddrList) > 0 {
		used := make([]bool, len(devs))
		var od []*roce.Device
		var oa []netip.Addr
		for _, e := range p.DevAddrList {
			da, _ := ParseDevAddr(e) // checked with the configuration
			for i, d := range devs {
				if used[i] || d == nil {
					continue
				}
				match := d.Info().Name == da.Name && da.Name != ""
				if da.Addr.IsValid() {
					_, err := d.GIDIndex(da.Addr.WithZone(""))
					match = err == nil
				}
				if match {
					used[i] = true
					od = append(od, d)
					oa = append(oa, da.Addr.WithZone(""))
					break
				}
			}
		}
		if len(od) == 0 {
			return nil, nil, errors.New("no device matches rdma_dev_addr_list")
		}
		devs, addrs = od, oa
	}
	n := 1
	if p.MultipathEnabled {
		n = min(len(devs), 1+int(p.MaxBackupDevices))
	}
	for _, d := range devs[:n] {
		if d == nil {
			return nil, nil, errors.New("nil device")
		}
	}
	return devs[:n], addrs[:n], nil
}
