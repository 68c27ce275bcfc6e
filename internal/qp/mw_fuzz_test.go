package qp_test

import (
	"testing"
	"time"
	"unsafe"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// mwModel is what the fuzz target expects of one window, kept from the
// outcomes it has seen and checked against rules of its own.
type mwModel struct {
	mw     *qp.MW
	typ    qp.MWType
	live   bool // bound to a non-empty range
	key    uint32
	qp     int // type 2: index of the binding QP
	addr   uint64
	length uint64
	access qp.Access
}

const (
	fzBase = 0x10000
	fzSize = 2048
)

// FuzzMWBindInvalidate runs random sequences of binds, local and remote
// invalidations, deallocations and remote READs and WRITEs over three
// windows of B's region, reached through two connections. Nothing panics;
// every bind is granted exactly when the rules allow it; the responder's
// key resolution grants exactly what a live window covers, through the
// right QP; a remote access that succeeds lies inside a live window; and
// no byte outside the region changes.
func FuzzMWBindInvalidate(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 8, 16, 7, 3, 0, 0, 0, 8, 4, 0})
	f.Add([]byte{0, 2, 1, 0, 0, 32, 7, 3, 2, 1, 0, 0, 8, 1, 1, 2, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 0, 1, 255, 2, 4, 1, 0, 0, 0, 0, 0, 3, 1, 0, 0, 4, 2, 0})
	f.Fuzz(fuzzMW)
}

func fuzzMW(t *testing.T, data []byte) {
	{
		if len(data) > 600 {
			data = data[:600]
		}
		n, err := qptest.NewNet(qptest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var as, bs [2]*qptest.Endpoint
		for i := range as {
			as[i], _ = qptest.NewEndpoint(n.A.E, qp.RC, 8)
			if i == 0 {
				bs[i], _ = qptest.NewEndpoint(n.B.E, qp.RC, 8)
			} else {
				q, err := bs[0].PD.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: bs[0].SCQ, RecvCQ: bs[0].RCQ,
					Cap: qp.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
				if err != nil {
					t.Fatal(err)
				}
				bs[i] = &qptest.Endpoint{PD: bs[0].PD, SCQ: bs[0].SCQ, RCQ: bs[0].RCQ, QP: q}
			}
			if err := n.Connect(as[i].QP, bs[i].QP, qptest.DefaultRC); err != nil {
				t.Fatal(err)
			}
		}
		all, mem := guarded(fzSize)
		pd := bs[0].PD
		mrBind, _ := pd.RegMR(mem, fzBase, qp.AccessLocalWrite|qp.AccessMWBind)
		mrNoBind, _ := pd.RegMR(make([]byte, fzSize), fzBase+fzSize, qp.AccessLocalWrite)
		recvBuf, _ := pd.RegMR(make([]byte, 64), 0x100, qp.AccessLocalWrite)
		var aMR [2]*qp.MR
		for i := range aMR {
			aMR[i], _ = as[i].PD.RegMR(make([]byte, 256), 0x1000, qp.AccessLocalWrite)
		}
		ws := []*mwModel{{typ: qp.MWType2}, {typ: qp.MWType2}, {typ: qp.MWType1}}
		alloc := func(w *mwModel) {
			mw, err := pd.AllocMW(w.typ)
			if err != nil {
				t.Fatal(err)
			}
			*w = mwModel{mw: mw, typ: w.typ, key: mw.RKey()}
		}
		for _, w := range ws {
			alloc(w)
		}
		var wcs []qp.WorkCompletion
		// await runs the network until cq has a completion and returns it.
		await := func(cq *qp.CQ) (qp.WorkCompletion, bool) {
			wcs = wcs[:0]
			_ = n.Run(func() bool { wcs = pollAll(cq, wcs); return len(wcs) > 0 }, time.Second)
			if len(wcs) == 0 {
				return qp.WorkCompletion{}, false
			}
			return wcs[0], true
		}
		// heal reconnects a connection one of whose ends failed.
		heal := func() {
			_ = n.Run(func() bool { return false }, 10*time.Millisecond)
			for i := range as {
				if as[i].QP.State() == qp.StateRTS && bs[i].QP.State() == qp.StateRTS {
					continue
				}
				for _, q := range []*qp.QP{as[i].QP, bs[i].QP} {
					if err := q.Modify(&qp.QPAttr{State: qp.StateReset}, qp.AttrState); err != nil {
						t.Fatal(err)
					}
				}
				pollAll(as[i].SCQ, nil)
				pollAll(as[i].RCQ, nil)
				pollAll(bs[0].SCQ, nil)
				pollAll(bs[0].RCQ, nil)
				if err := n.Connect(as[i].QP, bs[i].QP, qptest.DefaultRC); err != nil {
					t.Fatal(err)
				}
			}
		}
		// allowed is the rule the responder must follow.
		allowed := func(qi int, key uint32, need qp.Access, va uint64, n uint32) bool {
			for _, w := range ws {
				if w.live && w.key == key && (w.typ == qp.MWType1 || w.qp == qi) && w.access&need == need &&
					va >= w.addr && va-w.addr <= w.length && uint64(n) <= w.length-(va-w.addr) {
					return true
				}
			}
			return false
		}
		for len(data) >= 7 {
			op, wi, qi := data[0]%5, int(data[1])%len(ws), int(data[2])%2
			x, y, z, v := data[3], data[4], data[5], data[6]
			data = data[7:]
			w := ws[wi]
			switch op {
			case 0: // bind
				mr := mrBind
				if x&0x80 != 0 {
					mr = mrNoBind
				}
				addr := mr.IOVA() + uint64(x&0x7F)*16 - 64
				length := uint64(y) * 8
				acc := qp.Access(z) & (qp.AccessRemoteRead | qp.AccessRemoteWrite | qp.AccessRemoteAtomic | qp.AccessLocalWrite)
				if v&1 != 0 {
					acc |= 1 << 12 // not a window right
				}
				valid := w.mw != nil && mr == mrBind && acc&(1<<12) == 0 &&
					addr >= mr.IOVA() && addr+length <= mr.IOVA()+uint64(mr.Len())
				var key uint32
				if w.typ == qp.MWType1 {
					info := qp.MWBindInfo{MR: mr, Addr: addr, Length: length, Access: acc}
					if length == 0 {
						info = qp.MWBindInfo{Access: acc}
						valid = w.mw != nil && acc&(1<<12) == 0
					}
					k, err := bs[qi].QP.BindMW(w.mw, &qp.MWBind{ID: 1, Flags: qp.SendSignaled, Info: info})
					if err != nil {
						continue
					}
					key = k
				} else {
					valid = valid && !w.live && length > 0
					key = w.key&^0xFF | uint32(v)
					if err := bs[qi].QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, MW: w.mw,
						RKey: key, Bind: qp.MWBindInfo{MR: mr, Addr: addr, Length: length, Access: acc}}); err != nil {
						continue
					}
				}
				wc, ok := await(bs[0].SCQ)
				if !ok {
					t.Fatal("bind did not complete")
				}
				if (wc.Status == qp.WCSuccess) != valid {
					t.Fatalf("bind %+v of window %d (%+v): status %v, rules say valid=%v", wc, wi, *w, wc.Status, valid)
				}
				if valid {
					*w = mwModel{mw: w.mw, typ: w.typ, live: length > 0, key: key, qp: qi, addr: addr, length: length, access: acc}
					if w.mw.RKey() != key {
						t.Fatalf("window key %#x after bind, want %#x", w.mw.RKey(), key)
					}
				}
			case 1, 4: // LOCAL_INV at B, or SEND_WITH_INV from A
				key := w.key
				if x&1 != 0 {
					key ^= uint32(y) | 1
				}
				valid := w.mw != nil && w.live && w.typ == qp.MWType2 && w.qp == qi && key == w.key
				var wc qp.WorkCompletion
				var ok bool
				if op == 1 {
					if err := bs[qi].QP.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRLocalInv, Flags: qp.SendSignaled, InvalidateRKey: key}); err != nil {
						continue
					}
					wc, ok = await(bs[0].SCQ)
				} else {
					if bs[qi].QP.PostRecv(&qp.RecvWR{ID: 3, SGL: []qp.SGE{{Addr: 0x100, Length: 64, LKey: recvBuf.LKey()}}}) != nil {
						continue
					}
					if err := as[qi].QP.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRSendWithInv, InvalidateRKey: key,
						SGL: []qp.SGE{{Addr: 0x1000, Length: 8, LKey: aMR[qi].LKey()}}}); err != nil {
						continue
					}
					wc, ok = await(bs[0].RCQ)
				}
				if ok && (wc.Status == qp.WCSuccess) != valid && wc.Status != qp.WCWRFlushErr {
					t.Fatalf("invalidate %#x of window %d (%+v) via QP %d: %+v, rules say valid=%v", key, wi, *w, qi, wc, valid)
				}
				if ok && wc.Status == qp.WCSuccess {
					w.live = false
				}
			case 2: // dealloc and allocate again
				if w.mw.Dealloc() != nil {
					t.Fatal("dealloc failed")
				}
				alloc(w)
			case 3: // remote READ or WRITE from A
				key := w.key
				if x&1 != 0 {
					key ^= uint32(z)
				}
				opc, need := qp.WRRDMARead, qp.AccessRemoteRead
				if x&2 != 0 {
					opc, need = qp.WRRDMAWrite, qp.AccessRemoteWrite
				}
				va := fzBase + uint64(y)*8 - 64
				ln := uint32(v) + 1
				if err := as[qi].QP.PostSend(&qp.SendWR{ID: 4, Opcode: opc, Flags: qp.SendSignaled, RemoteAddr: va, RKey: key,
					SGL: []qp.SGE{{Addr: 0x1000, Length: ln, LKey: aMR[qi].LKey()}}}); err != nil {
					continue
				}
				if wc, ok := await(as[qi].SCQ); ok && wc.Status == qp.WCSuccess && !allowed(qi, key, need, va, ln) {
					t.Fatalf("%v of %d bytes at %#x with key %#x through QP %d succeeded outside every live window %+v %+v %+v",
						opc, ln, va, key, qi, *ws[0], *ws[1], *ws[2])
				}
			}
			heal()
			// The responder's resolution, probed directly, follows the rule
			// exactly and hands out the region's own bytes.
			for qi := range bs {
				for _, w := range ws {
					for _, pr := range [...]struct {
						dva uint64
						n   uint32
					}{{0, 1}, {0, uint32(w.length)}, {8, 8}, {w.length - 1, 1}, {w.length, 1}, {^uint64(0), 2}} {
						va := w.addr + pr.dva
						for _, need := range []qp.Access{qp.AccessRemoteRead, qp.AccessRemoteWrite, qp.AccessRemoteAtomic} {
							b, ok := qp.RemoteSpan(bs[qi].QP, w.key, need, va, pr.n)
							if ok != allowed(qi, w.key, need, va, pr.n) {
								t.Fatalf("RemoteSpan(QP %d, %#x, %v, %#x, %d) = %v; window %+v", qi, w.key, need, va, pr.n, ok, *w)
							}
							if ok && len(b) > 0 && unsafe.SliceData(b) != &mem[va-fzBase] {
								t.Fatalf("RemoteSpan returned bytes outside the region at %#x", va)
							}
						}
					}
				}
			}
		}
		if !guardsIntact(all) {
			t.Fatal("write outside the registered region")
		}
	}
}
