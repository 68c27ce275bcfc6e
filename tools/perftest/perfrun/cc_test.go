package perfrun

import (
	"io"
	"testing"
)

func TestPerfCCFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
		on   bool
	}{
		{[]string{"write-bw", "192.0.2.1"}, true, false},
		{[]string{"write-bw", "--cc", "none", "192.0.2.1"}, true, false},
		{[]string{"write-bw", "--cc", "dcqcn", "192.0.2.1"}, true, true},
		{[]string{"write-bw", "--cc", "dctcp", "192.0.2.1"}, false, false},
		{[]string{"write-bw", "--loopback", "--cc", "dcqcn"}, true, true},
	} {
		p, code := parsePerf(c.args, io.Discard, io.Discard)
		if (p != nil) != c.ok {
			t.Errorf("%q: parsed %v (exit %d), want %v", c.args, p != nil, code, c.ok)
			continue
		}
		if p == nil {
			continue
		}
		cc, err := parseCC(*p.f.cc)
		if err != nil || cc.DCQCN != c.on {
			t.Errorf("%q: %+v, %v; want DCQCN %v", c.args, cc, err, c.on)
		}
	}
}
