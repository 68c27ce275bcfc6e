package cm

import "testing"

// BenchmarkConnectDisconnect measures one full connection setup and
// teardown (REQ, REP, RTU, DREQ, DREP, timewait) between two engines.
func BenchmarkConnectDisconnect(b *testing.B) {
	p := newPair(b)
	_ = p.b.e.Listen(testSID)
	b.ReportAllocs()
	for b.Loop() {
		aID, _ := p.establish()
		_ = p.a.e.Disconnect(aID, nil)
		p.pump()
		p.drain()
		p.a.events, p.b.events = p.a.events[:0], p.b.events[:0]
		p.sent = map[*side][]Outbound{}
	}
}
