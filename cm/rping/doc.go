// Package rping implements the test of rdma-core's rping over goroce: a
// client and a server that interoperate with the real tool in either role.
//
// Each ping the client advertises a source buffer (address, R_Key, length
// in a 16-byte SEND), the server RDMA READs the ping data from it and
// answers with a "go ahead" SEND; the client then advertises a sink buffer,
// the server RDMA WRITEs the data back into it and sends another go ahead,
// and the client may compare the two buffers (-V). The connection is made
// with the rdma_cm conventions of package cm (RDMA_PS_TCP, port 7174 by
// default, responder resources and initiator depth 1).
//
// The tests against the real tools in an rxe guest are in package
// interop/rdmacm; this package's own tests run both roles over an
// in-memory link.
package rping
