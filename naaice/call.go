package naaice

import (
	"context"
	"net/netip"
	"unsafe"

	"github.com/goroce/goroce/roce"
)

// Client calls routines on one NAA, one connection per Call. For many RPCs
// with the same regions keep a Context instead: its RPCs reuse the
// connection and the MRSP.
type Client struct {
	dev    *roce.Device
	remote netip.AddrPort
	opts   Options
}

// NewClient returns a client of the NAA at remote.
func NewClient(dev *roce.Device, remote netip.AddrPort, opts Options) *Client {
	c := &Client{dev: dev, remote: remote}
	c.opts = opts
	return c
}

// Call runs routine fn on the NAA: it connects, announces inputs (written
// to the NAA) and outputs (written back into the slices), runs one RPC and
// disconnects. A slice given as both an input and an output (the same
// memory) is one region, as naa_create makes it. A non-zero return code is
// a *RPCError, an MRSP refusal a *MRSPError.
func (cl *Client) Call(ctx context.Context, fn uint8, inputs, outputs [][]byte) error {
	params := make([][]byte, 0, len(inputs)+len(outputs))
	params = append(params, inputs...)
	outIdx := make([]int, len(outputs))
	for i, o := range outputs {
		outIdx[i] = -1
		for j, in := range inputs {
			if same(in, o) {
				outIdx[i] = j
				break
			}
		}
		if outIdx[i] < 0 {
			outIdx[i] = len(params)
			params = append(params, o)
		}
	}
	c, err := NewContext(cl.dev, cl.remote, params, nil, fn, cl.opts)
	if err != nil {
		return err
	}
	defer c.Close()
	for i := range inputs {
		_ = c.SetInput(i)
	}
	for _, j := range outIdx {
		_ = c.SetOutput(j)
	}
	if err := c.Connect(ctx); err != nil {
		return err
	}
	if err := c.DoMRSP(ctx); err != nil {
		return err
	}
	return c.DoRPC(ctx)
}

func same(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}
