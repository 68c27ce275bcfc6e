package fpga_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// The bring-up PyRogue performs, with the FPGA programmed out of band.
func Example() {
	var dev *roce.Device // an open device on the DAQ interface
	if dev == nil {
		return
	}
	ctx := context.Background()
	s, err := fpga.NewServer(dev, 1, -1, 0, 0) // 256 slots of 9000 bytes
	if err != nil {
		panic(err)
	}
	defer s.Stop()
	s.SetFPGAGID(ib.GIDFromAddr(netip.MustParseAddr("192.168.2.10")))
	// Program the FPGA with s.QPN(), s.RqPSN(), s.SqPSN() (and s.MRAddr(),
	// s.MRRKey() for the gen-1 firmware); it returns its QPN.
	var fpgaQPN uint32
	if err := s.CompleteConnection(ctx, fpgaQPN, s.SqPSN(), ib.MTU4096, 12); err != nil {
		panic(err)
	}
	err = s.Serve(ctx, func(f fpga.Frame) {
		fmt.Println(f.Channel(), len(f.Data()))
	})
	fmt.Println(err)
}
