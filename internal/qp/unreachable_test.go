// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qp_test

import (
	"runtime"
	"testing"
	"weak"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// TestDestroyedQPUnreachable: once destroyed, a QP (and the buffers its
// queues hold) is garbage, even when it was the engine's last QP.
func TestDestroyedQPUnreachable(t *testing.T) {
	e, err := qp.New(qp.Config{Clock: &qptest.Clock{}})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := e.AllocPD()
	cq, err := e.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	keep, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq, Cap: qp.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq, Cap: qp.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	wp := weak.Make(q)
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	q = nil
	for i := 0; i < 5 && wp.Value() != nil; i++ {
		runtime.GC()
	}
	if wp.Value() != nil {
		t.Error("the destroyed QP is still reachable from the engine")
	}
	runtime.KeepAlive(keep)
}
