// Package s3rdma is the client side of cuObject's S3-over-RDMA control
// path, speaking the public header protocol; its server is package
// cuobj/s3gw.
//
// A request that carries x-amz-rdma-token moves the object by RDMA: for a
// GET the server RDMA WRITEs it into the client's memory, for a PUT it
// RDMA READs it from there (Content-Length 0, the token's rsize is the
// object's size). The answer has no body and says x-amz-rdma-reply: 200
// (206 when the object was larger than the client's region, which then
// holds its start) and, for a GET, x-amz-rdma-bytes-transferred. A server
// without RDMA answers 501 NotImplemented, and the client falls back to
// the HTTP body (GET) or sends the body (PUT); an invalid token is 400
// InvalidRDMAToken, a failed transfer 500 RDMATransferFailed. An empty
// object goes by plain HTTP.
//
// Every request is signed with SigV4 (the AWS SDK's signer), the token
// headers among the signed ones, with credentials from ClientOptions or
// the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).
package s3rdma

// Header names of the protocol.
const (
	HeaderToken = "X-Amz-Rdma-Token"
	HeaderReply = "X-Amz-Rdma-Reply"
	HeaderBytes = "X-Amz-Rdma-Bytes-Transferred"
	HeaderAgent = "X-Amz-Rdma-Agent"
	AgentCuObj  = "cuobj"
)
