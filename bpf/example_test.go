//go:build linux

package bpf_test

import (
	"errors"
	"fmt"
	"log"
	"net"

	"github.com/cilium/ebpf"

	"github.com/goroce/goroce/bpf"
)

// Steer RoCEv2 arriving on rxeh0's queue 0 to an AF_XDP socket, leaving
// ARP, ICMP and TCP to the kernel.
func Example() {
	ifc, err := net.InterfaceByName("rxeh0")
	if err != nil {
		log.Fatal(err)
	}
	// Frags: the lab runs MTU 9000, where driver-mode XDP on a veth needs
	// a multi-buffer capable program.
	prog, err := bpf.Load(bpf.Options{Port: bpf.DefaultPort, Queues: 1, Frags: true})
	if errors.Is(err, ebpf.ErrNotSupported) {
		log.Fatalf("kernel too old: %v", err) // names the feature and the minimum kernel
	}
	if err != nil {
		log.Fatal(err)
	}
	defer prog.Close() // also detaches

	att, err := prog.Attach(ifc.Index, bpf.AttachAuto) // driver mode, else generic
	if err != nil {
		log.Fatal(err)
	}
	defer att.Close()
	fmt.Println("attached in", att.Mode(), "mode")

	var xskFD int // an AF_XDP socket bound to queue 0 of rxeh0 (package xdp)
	if err := prog.Register(0, xskFD); err != nil {
		log.Fatal(err)
	}

	info, err := bpf.Attached(ifc.Index) // what `rocectl link show` prints
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("xdp: id %d %s (%v)\n", info.ProgramID, info.Name, info.Mode)

	st, err := prog.Stats()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("redirected %d, no socket %d, passed %d\n", st.Redirected, st.NoSocket, st.Passed)
}
