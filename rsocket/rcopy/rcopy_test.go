package rcopy

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

func TestCopy(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a}, Neighbours: map[netip.Addr]net.HardwareAddr{b: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sout bytes.Buffer
	srv := &Server{Dev: db, Dir: dir, Out: &sout}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(sctx) }()
	var cout bytes.Buffer
	for i := 0; ; i++ {
		cout.Reset()
		err = Copy(ctx, da, src, "10.0.0.2", "dst", "", &cout)
		if err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("copy: %v\n%s", err, cout.String())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "dst"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("copied file: %d bytes of %d, %v", len(got), len(data), err)
	}
	if !strings.HasPrefix(cout.String(), "opening...transferring...closing...done\n3145745 bytes in ") {
		t.Errorf("client printed %q", cout.String())
	}
	if !strings.Contains(sout.String(), "client: 10.0.0.1\nopening: dst, transferring...3145745 bytes...closing...done\n") {
		t.Errorf("server printed %q", sout.String())
	}
	t.Logf("%s\n%s", cout.String(), sout.String())
}
