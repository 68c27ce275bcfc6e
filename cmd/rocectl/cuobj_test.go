package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// freeUDPPort returns a UDP port free on both addresses (a moment ago).
func freeUDPPort(t *testing.T, a, b string) int {
	for range 20 {
		c, err := net.ListenPacket("udp", a+":0")
		if err != nil {
			t.Skip(err)
		}
		port := c.LocalAddr().(*net.UDPAddr).Port
		d, err := net.ListenPacket("udp", b+":"+strconv.Itoa(port))
		c.Close()
		if err == nil {
			d.Close()
			return port
		}
	}
	t.Skip("no free UDP port")
	return 0
}

// TestCuobjCommand runs "rocectl cuobj serve" and put/get on the embedded
// UDP link (no root), then, when python3-boto3 is installed, a real S3
// client against the same server.
func TestCuobjCommand(t *testing.T) {
	srvAddr, cliAddr := "127.0.0.3", "127.0.0.4"
	port := strconv.Itoa(freeUDPPort(t, srvAddr, cliAddr))
	dir := t.TempDir()
	// The server and the clients sign with the same key pair.
	t.Setenv("AWS_ACCESS_KEY_ID", "GRCMDTESTKEY00000001")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "cmd-test-secret-0123456789abcdefghijklm")
	t.Setenv("AWS_REGION", "us-east-1")
	os.Mkdir(filepath.Join(dir, "bkt"), 0o755) // a directory is a bucket
	ctx, cancel := context.WithCancel(context.Background())
	old := cuobjSignalContext
	cuobjSignalContext = func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }
	defer func() { cuobjSignalContext = old }()
	var sout, serr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"cuobj", "serve", "--listen", "127.0.0.1:0", "--rdma", srvAddr, "--udp-port", port, dir}, &sout, &serr)
	}()
	re := regexp.MustCompile(`on (http://[0-9.:]+),`)
	var endpoint string
	for deadline := time.Now().Add(10 * time.Second); endpoint == ""; time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(sout.String()); m != nil {
			endpoint = m[1]
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("server did not start: %s %s", sout.String(), serr.String())
		}
	}
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, serr.String())
		}
		if !strings.Contains(sout.String(), "RDMA: 3 GETs") {
			t.Errorf("serve summary: %s", sout.String())
		}
	}()
	if !strings.Contains(sout.String(), "requests must be signed with the key pair of AWS_ACCESS_KEY_ID") {
		t.Errorf("serve banner: %s", sout.String())
	}
	in := filepath.Join(t.TempDir(), "in")
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	os.WriteFile(in, data, 0o644)
	var out, errOut bytes.Buffer
	if code := run([]string{"cuobj", "put", "--rdma", cliAddr, "--udp-port", port, endpoint + "/bkt/obj", in}, &out, &errOut); code != 0 {
		t.Fatalf("put: %d %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "by RDMA") || !strings.Contains(out.String(), "MB/s") {
		t.Errorf("put output: %s", out.String())
	}
	t.Log(strings.TrimSpace(out.String()))
	got := filepath.Join(t.TempDir(), "out")
	out.Reset()
	if code := run([]string{"cuobj", "get", "--rdma", cliAddr, "--udp-port", port, endpoint + "/bkt/obj", got}, &out, &errOut); code != 0 {
		t.Fatalf("get: %d %s", code, errOut.String())
	}
	t.Log(strings.TrimSpace(out.String()))
	if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
		t.Fatal("get: the file differs from what was put")
	}
	// The object went into a mapped temporary file, renamed into place.
	if ents, _ := os.ReadDir(filepath.Dir(got)); len(ents) != 1 {
		t.Errorf("get left %d files beside its target", len(ents)-1)
	}
	// Again over the file (its mode kept), and into a device, which is
	// not mapped but written.
	os.Chmod(got, 0o600)
	for _, target := range []string{got, os.DevNull} {
		out.Reset()
		if code := run([]string{"cuobj", "get", "--rdma", cliAddr, "--udp-port", port, endpoint + "/bkt/obj", target}, &out, &errOut); code != 0 {
			t.Fatalf("get into %s: %d %s", target, code, errOut.String())
		}
	}
	if st, err := os.Stat(got); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the file after a second get: %v %v", st, err)
	}
	if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
		t.Fatal("second get: the file differs from what was put")
	}
	if code := run([]string{"cuobj", "get", "--rdma", cliAddr, "--udp-port", port, "ftp://x/y", got}, &out, &errOut); code != 2 {
		t.Errorf("bad URL: exit %d", code)
	}
	// A real S3 client: plain PUT and GET, and the object goroce put by
	// RDMA, byte for byte.
	py := pythonWithBoto3()
	if py == "" {
		// CI installs python3-boto3; elsewhere this part is optional.
		t.Logf("skipping the boto3 client: no python3 with boto3 (Debian package python3-boto3)")
		return
	}
	script := `
import boto3, sys, hashlib
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")  # keys from the environment
s3.put_object(Bucket="bkt", Key="plain/one", Body=b"hello boto3")
assert s3.get_object(Bucket="bkt", Key="plain/one")["Body"].read() == b"hello boto3"
body = s3.get_object(Bucket="bkt", Key="obj")["Body"].read()
print(len(body), hashlib.sha256(body).hexdigest())
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="bkt")["Contents"]]
assert keys == ["obj", "plain/one"], keys
s3.delete_object(Bucket="bkt", Key="plain/one")
`
	cmd := exec.Command(py, "-c", script, endpoint)
	cmd.Env = append(os.Environ(), "AWS_CA_BUNDLE=") // plain HTTP
	res, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("boto3: %v\n%s", err, res)
	}
	var want string
	{
		h := sha256Hex(data)
		want = strconv.Itoa(len(data)) + " " + h
	}
	if strings.TrimSpace(string(res)) != want {
		t.Fatalf("boto3 read %q, want %q", res, want)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// pythonWithBoto3 returns a python3 that imports boto3: python3 from PATH,
// else /usr/bin/python3 (where Debian's python3-boto3 lives when a version
// manager puts its own python3 first on PATH); "" when neither does.
func pythonWithBoto3() string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import boto3").Run() == nil {
			return py
		}
	}
	return ""
}

// TestCuobjServeMakesKeys: without credentials in the environment, serve
// makes a key pair and prints the exports; a client with them is served,
// one without a key is refused.
func TestCuobjServeMakesKeys(t *testing.T) {
	srvAddr, cliAddr := "127.0.0.5", "127.0.0.6"
	port := strconv.Itoa(freeUDPPort(t, srvAddr, cliAddr))
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "bkt"), 0o755)
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	ctx, cancel := context.WithCancel(context.Background())
	old := cuobjSignalContext
	cuobjSignalContext = func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }
	defer func() { cuobjSignalContext = old }()
	var sout, serr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"cuobj", "serve", "--listen", "127.0.0.1:0", "--rdma", srvAddr, "--udp-port", port, dir}, &sout, &serr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, serr.String())
		}
	}()
	re := regexp.MustCompile(`(?s)on (http://[0-9.:]+),.*export AWS_ACCESS_KEY_ID=(\S+)\nexport AWS_SECRET_ACCESS_KEY=(\S+)\n`)
	var m []string
	for deadline := time.Now().Add(20 * time.Second); m == nil; time.Sleep(20 * time.Millisecond) {
		m = re.FindStringSubmatch(sout.String())
		if m == nil && time.Now().After(deadline) {
			t.Fatalf("serve printed no key pair: %s %s", sout.String(), serr.String())
		}
	}
	in := filepath.Join(t.TempDir(), "in")
	os.WriteFile(in, []byte("made keys"), 0o644)
	var out, errOut bytes.Buffer
	if code := run([]string{"cuobj", "put", "--rdma", cliAddr, "--udp-port", port, m[1] + "/bkt/obj", in}, &out, &errOut); code == 0 {
		t.Fatalf("put without keys succeeded: %s", out.String())
	}
	t.Setenv("AWS_ACCESS_KEY_ID", m[2])
	t.Setenv("AWS_SECRET_ACCESS_KEY", m[3]+"x")
	if code := run([]string{"cuobj", "put", "--rdma", cliAddr, "--udp-port", port, m[1] + "/bkt/obj", in}, &out, &errOut); code == 0 {
		t.Fatalf("put with a wrong secret succeeded: %s", out.String())
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", m[3])
	errOut.Reset()
	if code := run([]string{"cuobj", "put", "--rdma", cliAddr, "--udp-port", port, m[1] + "/bkt/obj", in}, &out, &errOut); code != 0 {
		t.Fatalf("put with the printed keys: %d %s", code, errOut.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "bkt", "obj")); string(b) != "made keys" {
		t.Errorf("stored %q", b)
	}
	// An empty file goes by HTTP, and says so.
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o644)
	out.Reset()
	if code := run([]string{"cuobj", "put", "--rdma", cliAddr, "--udp-port", port, m[1] + "/bkt/empty", empty}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "by HTTP (an empty object") {
		t.Errorf("empty put: %d %s %s", code, out.String(), errOut.String())
	}
	out.Reset()
	got := filepath.Join(t.TempDir(), "got")
	if code := run([]string{"cuobj", "get", "--rdma", cliAddr, "--udp-port", port, m[1] + "/bkt/empty", got}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "empty object") {
		t.Errorf("empty get: %d %s %s", code, out.String(), errOut.String())
	}
	if st, err := os.Stat(got); err != nil || st.Size() != 0 {
		t.Errorf("empty get wrote %v %v", st, err)
	}
}

// TestCuobjTimeout: put and get against a server that accepts and never
// answers give up after --timeout, say so, and leave no file; on a
// terminal the put shows its progress once it has run a second, and
// clears it.
func TestCuobjTimeout(t *testing.T) {
	cliAddr := "127.0.0.7"
	port := strconv.Itoa(freeUDPPort(t, cliAddr, "127.0.0.8"))
	t.Setenv("AWS_ACCESS_KEY_ID", "GRCMDTESTKEY00000002")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "cmd-test-secret-0123456789abcdefghijklm")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	old := cuobjIsTerminal
	cuobjIsTerminal = func(io.Writer) bool { return true }
	defer func() { cuobjIsTerminal = old }()
	in := filepath.Join(t.TempDir(), "in")
	os.WriteFile(in, []byte("never stored"), 0o644)
	got := filepath.Join(t.TempDir(), "got")
	url := "http://" + ln.Addr().String() + "/bkt/obj"
	for _, c := range []struct {
		sub, file string
		timeout   string
		progress  bool
	}{{"put", in, "1.5s", true}, {"get", got, "300ms", false}} {
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run([]string{"cuobj", c.sub, "--rdma", cliAddr, "--udp-port", port, "--timeout", c.timeout, url, c.file}, &out, &errOut)
		}()
		select {
		case code := <-done:
			if code != 1 || !strings.Contains(errOut.String(), "gave up after --timeout "+c.timeout) {
				t.Errorf("%s: exit %d: %s", c.sub, code, errOut.String())
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s with --timeout %s still running", c.sub, c.timeout)
		}
		if c.progress && !strings.Contains(out.String(), "\r\033[KPUT bkt/obj: 12 bytes, 1 s so far\r\033[K") {
			t.Errorf("%s: progress %q", c.sub, out.String())
		}
	}
	if _, err := os.Stat(got); err == nil {
		t.Error("a get that gave up wrote the file")
	}
}
