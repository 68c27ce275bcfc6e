package rocemetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/roce"
)

// help describes each counter for the metric's HELP line.
var help = map[string]string{
	"sent_pkts":                  "Frames handed to the link.",
	"rcvd_pkts":                  "Frames received from the link.",
	"duplicate_request":          "Requests received with a PSN already executed.",
	"out_of_seq_request":         "Requests received past the expected PSN (sequence NAK sent).",
	"rcvd_seq_err":               "PSN sequence error NAKs received.",
	"rcvd_rnr_err":               "RNR NAKs received.",
	"send_rnr_err":               "RNR NAKs sent.",
	"ack_deferred":               "ACKs folded into a later ACK of the same receive batch.",
	"retry_exceeded_err":         "Work completions with RETRY_EXC_ERR.",
	"retry_rnr_exceeded_err":     "Work completions with RNR_RETRY_EXC_ERR.",
	"completer_retry_err":        "Go-back-N retransmissions started.",
	"send_err":                   "Frames that could not be built or sent.",
	"rdma_sends":                 "Request packets sent.",
	"rdma_recvs":                 "Request packets accepted.",
	"icrc_err":                   "Frames dropped for a bad ICRC.",
	"bad_frame":                  "Frames that are not well-formed RoCEv2.",
	"bad_dgid":                   "Frames to an address not in the GID table.",
	"unknown_qp":                 "Packets for a QP number that does not exist.",
	"bad_key":                    "P_Key or Q_Key violations.",
	"bad_addr":                   "RC/UC packets not from the QP's peer address or not to its own.",
	"rcvd_dropped":               "Packets the transport dropped for other reasons.",
	"no_neighbour":               "Sends or resolutions without a destination MAC.",
	"link_err":                   "Link read errors.",
	"timeouts":                   "Retransmit timer expiries.",
	"cq_overflow":                "Completions lost to full completion queues.",
	"probes":                     "Resends of the first unacknowledged PSN after a few round trips without progress.",
	"spurious_probes":            "Probes found needless: the path had stalled and nothing was lost.",
	"rkey_violation":             "Requests refused with a remote access error: R_Key, access or range not granted by an MR or memory window.",
	"np_ecn_marked_roce_packets": "Congestion control: CE-marked packets received.",
	"np_cnp_sent":                "Congestion control: CNPs sent.",
	"rp_cnp_handled":             "Congestion control: CNPs that cut a QP's rate.",
	"rp_cnp_ignored":             "Congestion control: CNPs that did not (within the rate reduce monitor period, or with congestion control off).",
}

// Collector is a prometheus.Collector for one device.
type Collector struct {
	d        *roce.Device
	counters []*prometheus.Desc
	mtu      *prometheus.Desc
	gids     *prometheus.Desc
	info     *prometheus.Desc
	rate     *prometheus.Desc
	infoVals []string
}

// New returns a collector for d; name labels its metrics (device="name").
func New(d *roce.Device, name string) *Collector {
	labels := prometheus.Labels{"device": name}
	c := &Collector{d: d}
	for _, n := range roce.CounterNames {
		h := help[n]
		if h == "" {
			h = n
		}
		c.counters = append(c.counters, prometheus.NewDesc("roce_"+n+"_total", h, nil, labels))
	}
	c.mtu = prometheus.NewDesc("roce_port_active_mtu_bytes", "Active IB MTU of the port.", nil, labels)
	c.gids = prometheus.NewDesc("roce_port_gids", "Populated GID table entries.", nil, labels)
	c.rate = prometheus.NewDesc("roce_rp_current_rate_bits_per_second",
		"Congestion control: the lowest current DCQCN rate of a rate-limited QP (0: none limited).", nil, labels)
	c.info = prometheus.NewDesc("roce_device_info", "Device description (value 1).",
		[]string{"link", "interface", "fallback"}, labels)
	i := d.Info()
	fb := "false"
	if i.Fallback != "" {
		fb = "true"
	}
	c.infoVals = []string{i.Link.Kind, i.Name, fb}
	return c
}

// Describe sends the descriptors of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	ch <- c.mtu
	ch <- c.gids
	ch <- c.info
	ch <- c.rate
}

// Collect reads the device counters once and sends them.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctr := c.d.Counters()
	i := 0
	ctr.Each(func(_ string, v uint64) {
		ch <- prometheus.MustNewConstMetric(c.counters[i], prometheus.CounterValue, float64(v))
		i++
	})
	p := c.d.QueryPort()
	ch <- prometheus.MustNewConstMetric(c.mtu, prometheus.GaugeValue, float64(p.ActiveMTU.Bytes()))
	ch <- prometheus.MustNewConstMetric(c.gids, prometheus.GaugeValue, float64(len(c.d.GIDs())))
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, c.infoVals...)
	ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, float64(c.d.CCMinRate()))
}
