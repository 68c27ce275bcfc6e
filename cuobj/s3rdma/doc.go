// Package s3rdma is the S3-over-RDMA control path of cuObject: an S3
// server that stores objects in a directory and a client, speaking the
// public header protocol.
//
// A request that carries x-amz-rdma-token moves the object by RDMA: for a
// GET the server RDMA WRITEs it into the client's memory, for a PUT it
// RDMA READs it from there (Content-Length 0, the token's rsize is the
// object's size). The answer has no body and says x-amz-rdma-reply: 200
// (206 when the object was larger than the client's region, which then
// holds its start) and, for a GET, x-amz-rdma-bytes-transferred. A server
// without RDMA answers 501 NotImplemented, and the client falls back to
// the HTTP body (GET) or sends the body (PUT); an invalid token is 400
// InvalidRDMAToken, a failed transfer 500 RDMATransferFailed.
//
// Without a token the server is a plain S3 server (GET, PUT, HEAD, DELETE
// of objects, PUT of a bucket, ListObjectsV2), so ordinary S3 clients work
// on the same objects. It does not check signatures.
package s3rdma

// Header names of the protocol.
const (
	HeaderToken       = "X-Amz-Rdma-Token"
	HeaderReply       = "X-Amz-Rdma-Reply"
	HeaderBytes       = "X-Amz-Rdma-Bytes-Transferred"
	HeaderAgent       = "X-Amz-Rdma-Agent"
	AgentCuObj        = "cuobj"
	errInvalidToken   = "InvalidRDMAToken"
	errTransferFailed = "RDMATransferFailed"
)
