package cuobj_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/roce"
)

// A client lends its memory to a server for one GET. The Get callback is
// the application's control path; here it calls the server directly,
// where a real one sends info.Desc in an x-amz-rdma-token header.
func Example() {
	var serverDev, clientDev *roce.Device // from roce.Open or roce.OpenLink
	if serverDev == nil || clientDev == nil {
		return
	}
	ctx := context.Background()
	srv, err := cuobj.NewServer(serverDev, netip.MustParseAddrPort("192.0.2.1:18515"), cuobj.ServerOptions{})
	if err != nil {
		return
	}
	defer srv.Close()
	object := []byte("hello, cuObject")
	sbuf, _ := srv.AllocHostBuffer(len(object))
	copy(sbuf, object)
	sreg, err := srv.RegisterBuffer(sbuf)
	if err != nil {
		return
	}
	defer srv.DeregisterBuffer(sreg)
	ch, err := srv.AllocateChannel()
	if err != nil {
		return
	}
	defer srv.FreeChannel(ch)

	get := func(h *cuobj.Handle, chunk []byte, off int64, info *cuobj.RDMAInfo) (int, error) {
		n, err := srv.HandleGetObject(h.Context(), &cuobj.Request{Key: cuobj.GetCtx(h).(string),
			Local: sreg, LocalOffset: uint64(off), RemoteAddr: info.Token.Addr,
			Size: uint64(min(len(chunk), len(object)-int(off))), Token: info.Desc, Channel: ch})
		return int(n), err // errors.Is(err, syscall.EIO), cuobj.CompletionStatus(err)
	}
	cli, err := cuobj.NewClient(clientDev, cuobj.Ops{Get: get}, cuobj.ClientOptions{})
	if err != nil {
		return
	}
	defer cli.Close()
	buf := make([]byte, 64)
	if err := cli.Register(buf); err != nil {
		return
	}
	defer cli.Deregister(buf)
	n, err := cli.Get(ctx, "object-1", buf, 0, 0)
	fmt.Println(string(buf[:n]), err)
}
