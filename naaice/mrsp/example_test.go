package mrsp_test

import (
	"fmt"

	"github.com/goroce/goroce/naaice/mrsp"
)

// A host with two 1000-byte parameters (the second also an output) runs
// MRSP and one RPC of function code 1 against an NAA.
func Example() {
	addrs := mrsp.SequentialNAAAddrs(0, []uint32{1000, 1000}, nil)
	req := []mrsp.Region{
		{Flags: mrsp.FlagInput, NAAAddr: addrs[0], HostAddr: 0x7000, RKey: 1, Size: 1000},
		{Flags: mrsp.FlagInput | mrsp.FlagOutput, NAAAddr: addrs[1], HostAddr: 0x8000, RKey: 2, Size: 1000},
	}
	aar, _ := mrsp.AppendAAR(nil, req)
	fmt.Printf("AAR %d bytes, header % x\n", len(aar), aar[:4])

	// NAA: validate, allocate, answer.
	got, err := mrsp.ParseAAR(aar, &mrsp.DefaultLimits, nil)
	if err != nil {
		fmt.Println(mrsp.AppendErr(nil, err.(*mrsp.Error).Code))
		return
	}
	a, _ := mrsp.AppendA(nil, []mrsp.Advert{{Addr: 0xa0000, RKey: 9, Size: got[0].Size}, {Addr: 0xb0000, RKey: 9, Size: got[1].Size}})

	// Host: take the answer and plan the RPC.
	adv, _ := mrsp.ParseA(a, nil)
	imm, _ := mrsp.HostImm(1, [3]byte{})
	writes, _ := mrsp.HostWrites(req, adv, 0, nil, imm, nil)
	for _, w := range writes {
		fmt.Printf("host write %d bytes to %#x imm=%v %#x\n", w.Len, w.RemoteAddr, w.WithImm, w.Imm)
	}
	back, _ := mrsp.NAAWrites(got, mrsp.RCSuccess, nil)
	fmt.Printf("NAA write %d bytes to %#x imm %#x\n", back[0].Len, back[0].RemoteAddr, back[0].Imm)
	// Output:
	// AAR 52 bytes, header 01 02 00 00
	// host write 1000 bytes to 0xa0000 imm=false 0x0
	// host write 1000 bytes to 0xb0000 imm=true 0x81
	// NAA write 1000 bytes to 0x8000 imm 0x0
}
