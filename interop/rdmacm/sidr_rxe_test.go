package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/cm/rping"
	"github.com/goroce/goroce/roce"
)

// TestRxeSIDR resolves librdmacm's udaddy server (RDMA_PS_UDP) with
// SIDR from cm.Dial, then exchanges udaddy's datagrams with it: two
// 100-byte messages to the server's UD QP, two replies back to ours.
// Only the rdma_cm part is cm's; the datagrams show the resolved QPN and
// Q_Key work.
func TestRxeSIDR(t *testing.T) {
	_, g, dev := rxeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job := g.Start(ctx, "udaddy", "-b", g.Addr.String(), "-C", "2", "-c", "1")
	defer job.Wait()
	const msgSize = 100 // udaddy's default message size
	var recvMR *roce.MR
	rbuf := make([]byte, 2*(roce.GRHSize+msgSize))
	opts := cm.DialOptions{PortSpace: mad.PortSpaceUDP, QP: cm.QPOptions{Prepare: func(c *cm.Conn) error {
		var err error
		if recvMR, err = c.PD().RegisterMR(rbuf, roce.AccessLocalWrite); err != nil {
			return err
		}
		for i := 0; i < 2; i++ {
			n := roce.GRHSize + msgSize
			if err := c.QP().PostRecv(&roce.RecvWR{ID: uint64(i), SGL: []roce.SGE{recvMR.SGE(i*n, n)}}); err != nil {
				return err
			}
		}
		return nil
	}}}
	var conn *cm.Conn
	var err error
	for {
		conn, err = cm.Dial(ctx, dev, netip.AddrPortFrom(g.Addr, rping.DefaultPort), opts)
		// Until udaddy listens, rxe's CM answers SIDR_REP status UNSUPPORTED.
		if !errors.Is(err, mad.SIDRUnsupported) {
			break
		}
		if recvMR != nil {
			recvMR.Close()
			recvMR = nil
		}
		select {
		case <-job.Done():
			stdout, stderr, code, _ := job.Wait()
			t.Fatalf("udaddy exited %d before we resolved it\n%s%s", code, stdout, stderr)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatalf("SIDR: %v", err)
	}
	defer conn.Close()
	defer recvMR.Close()
	if conn.RemoteQKey() != mad.UDPQKey || conn.RemoteQPN() < 16 {
		t.Fatalf("SIDR_REP gave QPN %#x Q_Key %#x", conn.RemoteQPN(), conn.RemoteQKey())
	}
	msg := bytes.Repeat([]byte{0xA5}, msgSize)
	smr, err := conn.PD().RegisterMR(msg, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Close()
	// udaddy learns where to reply from the immediate data: the sender's QPN.
	for i := 0; i < 2; i++ {
		if err := conn.QP().PostSend(&roce.SendWR{ID: uint64(i), Opcode: roce.WRSendWithImm, Imm: conn.QP().QPN(), Flags: roce.SendSignaled,
			SGL: []roce.SGE{smr.SGE(0, msgSize)}, AH: conn.AH(), RemoteQPN: conn.RemoteQPN(), RemoteQKey: conn.RemoteQKey()}); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 2; {
		var wc [1]roce.WorkCompletion
		if conn.RecvCQ().Poll(wc[:]) == 1 {
			if wc[0].Status != roce.WCSuccess || wc[0].ByteLen != roce.GRHSize+msgSize || wc[0].SrcQP != conn.RemoteQPN() {
				t.Fatalf("reply completion %+v", wc[0])
			}
			got++
			continue
		}
		if err := conn.RecvCQ().Wait(ctx); err != nil {
			stdout, stderr, code, _ := job.Wait()
			t.Fatalf("waiting for udaddy's replies: %v\nudaddy exit %d\n%s%s", err, code, stdout, stderr)
		}
	}
	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 || !strings.Contains(string(stdout), "test complete") {
		t.Fatalf("udaddy: exit %d (%v)\n%s%s", code, err, stdout, stderr)
	}
	t.Logf("udaddy -b:\n%s", stdout)
}
