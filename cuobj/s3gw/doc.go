// Package s3gw is cuObject's S3 server: the versitygw S3 gateway over a
// directory (its posix backend: DIR/BUCKET/KEY is an object), with the
// bodies of requests that carry x-amz-rdma-token moved by RDMA through a
// cuobj.Server.
//
// versitygw does the S3 part: SigV4 for every request (one account, the
// credentials given to New), buckets, listings, multipart uploads,
// deletes, tagging, copies; an operation it does not know is an error,
// never a write. A PutObject or UploadPart with a token has no body (its
// Content-Length is 0): the gateway RDMA READs the token's rsize bytes
// from the client. A GetObject with a token RDMA WRITEs the object (or
// the requested range) into the client's region and answers headers
// only. Both answer x-amz-rdma-reply (200; 206 when the region held only
// the start of the object; 204 for nothing) and a GET
// x-amz-rdma-bytes-transferred, as package s3rdma's client expects.
//
// Admission is cuobj.Server's: a channel counted to the HTTP peer, then
// the connection to the client the token names, and only then the
// memory budget and a buffer of at most 16 MiB; a refusal is 503
// SlowDown with Retry-After, a client that does not answer 504. Without
// a cuobj.Server a token is declined with 501 and the client falls back
// to HTTP. An object moves through the buffer in 1 MiB pieces, all of
// the buffer's in flight at once on the request's channel (asynchronous
// requests) and overlapped with the file's I/O.
//
// What versitygw lacks is added here: the posix backend follows symbolic
// links, so a middleware refuses (403) a bucket, key or copy source that
// leads through one out of the directory; versitygw has no option for
// fasthttp's timeouts, so New sets the header, body and idle timeouts on
// the server of versitygw's (unexported) fiber app. The posix backend
// works relative to the process's working directory, which it changes to
// the directory: one Gateway per process at a time, and Close changes it
// back.
//
// Only this package and cmd/rocectl import versitygw (internal/layering
// enforces it): the rest of goroce builds without it.
package s3gw
