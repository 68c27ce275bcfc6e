package s3rdma

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/roce"
)

// Client gets and puts objects on an S3 endpoint, by RDMA when the server
// agrees and over HTTP otherwise.
type Client struct {
	endpoint string // "http://host:port"
	http     *http.Client
	rdma     *cuobj.Client
	creds    aws.Credentials
	region   string
	signer   *v4.Signer

	// Counters: objects and bytes moved by RDMA and over HTTP.
	RDMAObjects, HTTPObjects atomic.Uint64
	RDMABytes, HTTPBytes     atomic.Uint64
}

// ClientOptions configure NewClient.
type ClientOptions struct {
	HTTP *http.Client        // default http.DefaultClient
	RDMA cuobj.ClientOptions // options of the cuObject client
	// Credentials sign every request (SigV4); the zero value takes them
	// from the environment (CredentialsFromEnv).
	Credentials Credentials
}

// NewClient makes a client of the S3 endpoint ("http://host:port") that
// moves data by RDMA on dev.
func NewClient(dev *roce.Device, endpoint string, o ClientOptions) (*Client, error) {
	cr := o.Credentials
	if cr.AccessKey == "" && cr.SecretKey == "" {
		var ok bool
		if cr, ok = CredentialsFromEnv(); !ok {
			return nil, fmt.Errorf("s3rdma: no credentials: set %s and %s", EnvAccessKey, EnvSecretKey)
		}
	}
	if cr.AccessKey == "" || cr.SecretKey == "" {
		return nil, errors.New("s3rdma: credentials need both an access key and a secret key")
	}
	if cr.Region == "" {
		cr.Region = DefaultRegion
	}
	c := &Client{endpoint: strings.TrimSuffix(endpoint, "/"), http: o.HTTP, region: cr.Region,
		creds:  aws.Credentials{AccessKeyID: cr.AccessKey, SecretAccessKey: cr.SecretKey},
		signer: v4.NewSigner(func(so *v4.SignerOptions) { so.DisableURIPathEscaping = true })}
	if c.http == nil {
		c.http = http.DefaultClient
	}
	var err error
	c.rdma, err = cuobj.NewClient(dev, cuobj.Ops{Get: c.getChunk, Put: c.putChunk}, o.RDMA)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// RDMA returns the cuObject client (its memory registration).
func (c *Client) RDMA() *cuobj.Client { return c.rdma }

// Close closes the RDMA client.
func (c *Client) Close() error { return c.rdma.Close() }

type request struct {
	bucket, key string
	rdma        atomic.Bool // some chunk moved by RDMA
}

func (c *Client) url(r *request) string { return c.endpoint + "/" + r.bucket + "/" + r.key }

// Get reads object bucket/key into buf, which must be registered with
// c.RDMA() (or lie in a registration). It returns the bytes read and
// whether they came by RDMA. A buffer smaller than the object gets its
// start.
func (c *Client) Get(ctx context.Context, bucket, key string, buf []byte) (int64, bool, error) {
	r := &request{bucket: bucket, key: key}
	n, err := c.rdma.Get(ctx, r, buf, 0, 0)
	return n, r.rdma.Load(), err
}

// Put stores data, which must be registered with c.RDMA(), as object
// bucket/key, and says whether it went by RDMA. Objects larger than one
// callback (cuobj.MaxOpSize) are refused: S3 has no offset PUT. An empty
// object has nothing to move by RDMA: it goes by plain HTTP.
func (c *Client) Put(ctx context.Context, bucket, key string, data []byte) (bool, error) {
	r := &request{bucket: bucket, key: key}
	if len(data) == 0 {
		_, err := c.httpPut(ctx, r, nil)
		return false, err
	}
	if c.rdma.MaxRequestCallbackSize(data) < int64(len(data)) {
		return false, fmt.Errorf("s3rdma: %d-byte object: one PUT moves at most %d bytes", len(data), c.rdma.MaxRequestCallbackSize(data))
	}
	_, err := c.rdma.Put(ctx, r, data, 0, 0)
	return r.rdma.Load(), err
}

// Head returns the size of object bucket/key.
func (c *Client) Head(ctx context.Context, bucket, key string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, c.url(&request{bucket: bucket, key: key}), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.do(req, emptySHA256)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("s3rdma: HEAD %s/%s: %s", bucket, key, resp.Status)
	}
	return resp.ContentLength, nil
}

// Payload hashes: of a request without a body, and of an RDMA PUT.
const (
	emptySHA256     = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	unsignedPayload = "UNSIGNED-PAYLOAD"
)

// do signs req (SigV4, every header but the few the signer leaves out,
// so the RDMA token too) for a body whose SHA-256 is payloadHash, and
// sends it.
func (c *Client) do(req *http.Request, payloadHash string) (*http.Response, error) {
	req.Header.Set("X-Amz-Content-Sha256", payloadHash)
	if err := c.signer.SignHTTP(req.Context(), c.creds, req, payloadHash, "s3", c.region, time.Now()); err != nil {
		return nil, fmt.Errorf("s3rdma: sign: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", syscall.ECONNREFUSED, err)
	}
	return resp, nil
}

// statusErr maps an HTTP failure to an errno: 5xx and 429 are retryable
// (EIO, EAGAIN), 4xx are not.
func statusErr(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var errno syscall.Errno
	switch {
	case resp.StatusCode == http.StatusNotFound:
		errno = syscall.ENOENT
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		errno = syscall.EAGAIN
	case resp.StatusCode >= 500:
		errno = syscall.EIO
	default:
		errno = syscall.EINVAL
	}
	return fmt.Errorf("s3rdma: %s: %w: %s", resp.Status, errno, strings.TrimSpace(string(body)))
}

func (c *Client) getChunk(h *cuobj.Handle, chunk []byte, off int64, info *cuobj.RDMAInfo) (int, error) {
	r := cuobj.GetCtx(h).(*request)
	req, err := http.NewRequestWithContext(h.Context(), http.MethodGet, c.url(r), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(HeaderToken, info.Desc)
	req.Header.Set(HeaderAgent, AgentCuObj)
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+int64(len(chunk))-1))
	resp, err := c.do(req, emptySHA256)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotImplemented:
		// Declined: the same request again, over HTTP.
		return c.httpGet(h.Context(), r, chunk, off)
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && off > 0:
		return 0, nil // a chunk past the end of the object
	case resp.StatusCode/100 != 2:
		return 0, statusErr(resp)
	}
	n, err := strconv.ParseInt(resp.Header.Get(HeaderBytes), 10, 64)
	if err != nil || n < 0 || n > int64(len(chunk)) {
		return 0, fmt.Errorf("s3rdma: %w: %s %q", syscall.EPROTO, HeaderBytes, resp.Header.Get(HeaderBytes))
	}
	r.rdma.Store(true)
	c.RDMAObjects.Add(1)
	c.RDMABytes.Add(uint64(n))
	return int(n), nil
}

func (c *Client) httpGet(ctx context.Context, r *request, chunk []byte, off int64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(r), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+int64(len(chunk))-1))
	resp, err := c.do(req, emptySHA256)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && off > 0 {
		return 0, nil
	}
	if resp.StatusCode/100 != 2 {
		return 0, statusErr(resp)
	}
	n, err := io.ReadFull(resp.Body, chunk)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("%w: %v", syscall.ECONNRESET, err)
	}
	c.HTTPObjects.Add(1)
	c.HTTPBytes.Add(uint64(n))
	return n, nil
}

func (c *Client) putChunk(h *cuobj.Handle, chunk []byte, off int64, info *cuobj.RDMAInfo) (int, error) {
	r := cuobj.GetCtx(h).(*request)
	req, err := http.NewRequestWithContext(h.Context(), http.MethodPut, c.url(r), http.NoBody)
	if err != nil {
		return 0, err
	}
	req.Header.Set(HeaderToken, info.Desc)
	req.Header.Set(HeaderAgent, AgentCuObj)
	req.ContentLength = 0
	// As the protocol has it: the body that counts moves by RDMA.
	resp, err := c.do(req, unsignedPayload)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotImplemented:
		return c.httpPut(h.Context(), r, chunk)
	case resp.StatusCode/100 != 2:
		return 0, statusErr(resp)
	}
	r.rdma.Store(true)
	c.RDMAObjects.Add(1)
	c.RDMABytes.Add(uint64(len(chunk)))
	return len(chunk), nil
}

func (c *Client) httpPut(ctx context.Context, r *request, data []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.url(r), bytes.NewReader(data))
	if err != nil {
		return 0, err
	}
	sum := sha256.Sum256(data)
	resp, err := c.do(req, hex.EncodeToString(sum[:]))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return 0, statusErr(resp)
	}
	c.HTTPObjects.Add(1)
	c.HTTPBytes.Add(uint64(len(data)))
	return len(data), nil
}
