// Package fpga will implement the host side of RoCEv2 links to FPGA RDMA
// engines, interoperating with SLAC Rogue's RoCEv2 receive server
// (rogue.protocols.rocev2): an RC QP whose parameters (QPN, PSNs, GID,
// memory region) are exchanged over an out-of-band side channel rather than
// rdma_cm, and a zero-copy receive path in which the FPGA SENDs with
// immediate into a slab of posted receive buffers that are re-posted as
// their consumers release them. A software stand-in for the FPGA engine,
// for tests without the hardware, belongs here too.
//
// It is not implemented yet: this package holds no API. It sits above
// package roce (and cm where a connection manager is used) and below cmd;
// it imports nothing above cm.
package fpga
