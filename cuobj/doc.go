// Package cuobj will implement the RDMA side of NVIDIA cuObject's
// S3-over-RDMA protocol over goroce: a client that registers buffers and
// hands the server a descriptor ("RDMA token": buffer address, size, rkey,
// QP or DCT number and GID) in an HTTP header, and a server that answers a
// GET with RDMA WRITEs into that buffer and a PUT with RDMA READs from it.
// cuObject itself runs over Dynamically Connected (DC) transport, whose wire
// format is not public, so interoperating with NVIDIA peers is out of reach;
// what can be built and tested is the descriptor and control protocol over
// RC, as the open RC stand-ins for cuObject do.
//
// It is not implemented yet: this package holds no API. It sits above
// package cm and below cmd; it imports nothing above cm.
package cuobj
