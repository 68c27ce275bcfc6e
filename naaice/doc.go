// Package naaice will implement the NAAICE protocol for network-attached
// accelerators (NAAs) over goroce, interoperating with the public NAAICE C
// library (naa-communication-library) as host and as software NAA: an
// rdma_cm connection in the RDMA_PS_TCP port space, the memory region setup
// protocol (MRSP: a SEND each way naming the regions, their addresses, keys
// and sizes), then remote procedure calls made of RDMA WRITEs of the input
// regions, the last WRITE WITH IMMEDIATE carrying the function code, and the
// NAA's WRITEs of the results back with the return code in the immediate.
//
// It is not implemented yet: this package holds no API. It sits above
// package cm and below cmd; it imports nothing above cm.
package naaice
