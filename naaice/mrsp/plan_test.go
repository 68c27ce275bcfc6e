package mrsp

import "testing"

func TestPlans(t *testing.T) {
	adv := []Advert{{0xa000, 1, 1024}, {0xb000, 2, 1024}, {0xc000, 3, 1024}}
	req := append([]Region{}, exampleRegions...)
	req = append(req, Region{Flags: FlagInternal, NAAAddr: 12288, Size: 64})
	imm, _ := HostImm(3, [3]byte{})
	// First RPC: region 0 sends only 2 bytes, as the example client does.
	w, err := HostWrites(req, adv, 0, []uint32{2, 1024, 1024}, imm, nil)
	if err != nil || len(w) != 3 || w[0].Len != 2 || w[0].RemoteAddr != 0xa000 || w[0].WithImm ||
		!w[2].WithImm || w[2].Imm != 0x83 || w[2].RKey != 3 {
		t.Fatalf("%+v %v", w, err)
	}
	// Later RPCs drop the single-send region.
	w, err = HostWrites(req, adv, 1, nil, imm, nil)
	if err != nil || len(w) != 2 || w[0].Region != 1 || w[1].Region != 2 || !w[1].WithImm {
		t.Fatalf("%+v %v", w, err)
	}
	if _, err := HostWrites(req, adv, 0, []uint32{2000, 0, 0}, imm, nil); err != errRegionTooSmall {
		t.Fatal(err)
	}
	if _, err := HostWrites(req, adv[:2], 0, nil, imm, nil); err != errCountMismatch {
		t.Fatal(err)
	}
	single := []Region{{Flags: FlagSingleSend | FlagInput | FlagOutput, Size: 8}}
	if _, err := HostWrites(single, adv[:1], 1, nil, imm, nil); err != ErrNoWrites {
		t.Fatal("single-send only region after the first RPC:", err)
	}
	w, err = NAAWrites(req, 0, nil)
	if err != nil || len(w) != 1 || w[0].RemoteAddr != 0x55d0a0003000 || w[0].Len != 1024 || !w[0].WithImm || w[0].Imm != 0 {
		t.Fatalf("%+v %v", w, err)
	}
	if _, err := NAAWrites(req[:2], 0, nil); err != ErrNoWrites {
		t.Fatal(err)
	}
	a, err := NAAAbort(req, RCKernelTimeout)
	if err != nil || a.Imm != 0x200 || a.Len != 0 || a.RemoteAddr != 0x55d0a0001000 {
		t.Fatal(a, err)
	}
	h, err := HostAbort(adv)
	if err != nil || h.Imm != 0 || h.Len != 0 || h.RemoteAddr != 0xa000 || !h.WithImm {
		t.Fatal(h, err)
	}
	if _, err := HostAbort(nil); err != ErrNoWrites {
		t.Fatal(err)
	}
	if _, err := NAAAbort(req[3:], 1); err != ErrNoWrites {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(100, func() {
		out := make([]Write, 0, MaxAAREntries)
		_, _ = HostWrites(req, adv, 1, nil, imm, out)
	})
	if n != 0 {
		t.Fatal(n)
	}
}
