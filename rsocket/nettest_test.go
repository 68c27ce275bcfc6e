package rsocket

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/goroce/goroce/link/faultnet"
)

func TestNetConn(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := Listen(ctx, db, "tcp", ":0")
		if err != nil {
			return nil, nil, nil, err
		}
		acc := make(chan net.Conn, 1)
		go func() {
			c, _ := l.Accept()
			acc <- c
		}()
		c, err := Dial(ctx, da, "tcp4", fmt.Sprintf("%v:%d", addrB, l.Addr().(*net.TCPAddr).Port))
		if err != nil {
			l.Close()
			return nil, nil, nil, err
		}
		s := <-acc
		if s == nil {
			c.Close()
			l.Close()
			return nil, nil, nil, fmt.Errorf("accept failed")
		}
		return c, s, func() { c.Close(); s.Close(); l.Close() }, nil
	})
}

func TestHTTP(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	ctx := context.Background()
	l, err := Listen(ctx, db, "tcp", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 5<<20+3)
	rand.Read(body)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if r.Method == http.MethodPost && !bytes.Equal(in, body) {
			http.Error(w, "upload corrupted", 400)
			return
		}
		w.Write(body)
	})}
	go srv.Serve(l)
	defer srv.Close()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return Dial(ctx, da, network, addr)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	url := "http://" + netip.AddrPortFrom(addrB, 8080).String() + "/"
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 3; j++ {
				var resp *http.Response
				var err error
				if j%2 == 0 {
					resp, err = client.Get(url)
				} else {
					resp, err = client.Post(url, "application/octet-stream", bytes.NewReader(body))
				}
				if err != nil {
					t.Error(err)
					return
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, body) {
					t.Errorf("status %d, %d bytes, %v", resp.StatusCode, len(got), err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestManyConns(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lc := ListenConfig{Options: Options{ReceiveBuffer: 16 << 10, SendBuffer: 16 << 10, SQSize: 32, RQSize: 32}, Backlog: 64}
	l, err := lc.Listen(ctx, db, "tcp", ":7471")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 48
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	d := Dialer{Options: lc.Options}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.Dial(ctx, da, "tcp", netip.AddrPortFrom(addrB, 7471).String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			msg := make([]byte, 100<<10+i)
			rand.Read(msg)
			go func() {
				c.Write(msg)
				c.CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, msg) {
				t.Errorf("conn %d: %d bytes back of %d: %v", i, len(got), len(msg), err)
			}
		}()
	}
	wg.Wait()
}
