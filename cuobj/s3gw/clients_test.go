package s3gw

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cuobj/s3rdma"
)

// clientEnv is the environment of a real S3 client: the test account's
// keys, no configuration of the user's, plain HTTP (no CA bundle).
func clientEnv(t *testing.T) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	none := filepath.Join(t.TempDir(), "none")
	return append(env, s3rdma.EnvAccessKey+"="+creds.AccessKey, s3rdma.EnvSecretKey+"="+creds.SecretKey,
		"AWS_DEFAULT_REGION="+DefaultRegion, "AWS_CONFIG_FILE="+none, "AWS_SHARED_CREDENTIALS_FILE="+none,
		"AWS_EC2_METADATA_DISABLED=true")
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

const boto3Script = `
import boto3, sys, os
from boto3.s3.transfer import TransferConfig
ep, work, stage = sys.argv[1], sys.argv[2], sys.argv[3]
s3 = boto3.client("s3", endpoint_url=ep)
big = os.path.join(work, "big")
cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4)
if stage == "up":
    s3.create_bucket(Bucket="pybkt")
    s3.put_object(Bucket="pybkt", Key="small", Body=b"hello boto3")
    assert s3.get_object(Bucket="pybkt", Key="small")["Body"].read() == b"hello boto3"
    s3.upload_file(big, "pybkt", "dir/big", Config=cfg)
    etag = s3.head_object(Bucket="pybkt", Key="dir/big")["ETag"]
    assert etag.strip('"').endswith("-3"), etag  # three parts
    s3.download_file("pybkt", "dir/big", big + ".out", Config=cfg)
    assert open(big + ".out", "rb").read() == open(big, "rb").read()
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert "pybkt" in names and "bucket" in names, names
    for i in range(5):
        s3.put_object(Bucket="pybkt", Key="dir/k%d" % i, Body=b"x" * i)
    r = s3.list_objects_v2(Bucket="pybkt", Delimiter="/")
    assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["dir/"], r
    assert [o["Key"] for o in r["Contents"]] == ["small"], r
    keys, token = [], None
    while True:
        kw = {"Bucket": "pybkt", "Prefix": "dir/", "MaxKeys": 2}
        if token:
            kw["ContinuationToken"] = token
        r = s3.list_objects_v2(**kw)
        assert r["KeyCount"] <= 2, r
        keys += [o["Key"] for o in r["Contents"]]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert keys == ["dir/big", "dir/k0", "dir/k1", "dir/k2", "dir/k3", "dir/k4"], keys
else:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="pybkt")["Contents"]]
    r = s3.delete_objects(Bucket="pybkt", Delete={"Objects": [{"Key": k} for k in keys]})
    assert not r.get("Errors") and len(r["Deleted"]) == len(keys), r
    assert s3.list_objects_v2(Bucket="pybkt")["KeyCount"] == 0
    s3.delete_bucket(Bucket="pybkt")
    assert "pybkt" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
print("ok")
`

// TestBoto3: boto3 (Debian's python3-boto3) against the gateway: buckets,
// objects, a multipart upload with concurrent parts and a ranged
// download, listings with a delimiter and pages, batch delete; the
// multipart object is also read by RDMA, byte for byte.
func TestBoto3(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a real client takes tens of seconds")
	}
	py := pythonWithBoto3()
	if py == "" {
		t.Skip("no python3 with boto3 (Debian package python3-boto3)")
	}
	e := setup(t, true, nil)
	work := t.TempDir()
	big := make([]byte, 20<<20+12345)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(work, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	runPy := func(stage string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, py, "-c", boto3Script, e.url, work, stage)
		cmd.Env = clientEnv(t)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("boto3 %s: %v\n%s", stage, err, out)
		}
	}
	runPy("up")
	if got, err := os.ReadFile(filepath.Join(e.dir, "pybkt", "dir", "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("the multipart object in the directory: %v", err)
	}
	buf := make([]byte, len(big))
	if err := e.cli.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	if n, byRDMA, err := e.cli.Get(ctxT(t), "pybkt", "dir/big", buf); err != nil || !byRDMA || n != int64(len(big)) || !bytes.Equal(buf, big) {
		t.Fatalf("RDMA GET of the multipart object: %d bytes, RDMA %v, %v", n, byRDMA, err)
	}
	runPy("down")
	if _, err := os.Stat(filepath.Join(e.dir, "pybkt")); !os.IsNotExist(err) {
		t.Errorf("the deleted bucket: %v", err)
	}
}

// TestAWSCLI: the AWS CLI's s3 commands against the gateway: mb, cp of a
// file above its multipart threshold both ways, ls, sync both ways, rm,
// rb.
func TestAWSCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a real client takes tens of seconds")
	}
	aws, err := exec.LookPath("aws")
	if err != nil || exec.Command(aws, "--version").Run() != nil {
		t.Skip("no AWS CLI (Debian package awscli)")
	}
	e := setup(t, true, nil)
	env := clientEnv(t)
	cli := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, aws, append([]string{"--endpoint-url", e.url}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("aws %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	work := t.TempDir()
	big := make([]byte, 17<<20+321) // above the CLI's 8 MiB multipart threshold
	rand.Read(big)
	os.WriteFile(filepath.Join(work, "big"), big, 0o644)
	src := filepath.Join(work, "tree")
	files := map[string][]byte{"a": []byte("alpha"), "sub/b": make([]byte, 70000), "sub/deeper/c": []byte("c")}
	rand.Read(files["sub/b"])
	for name, b := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755)
		os.WriteFile(filepath.Join(src, name), b, 0o644)
	}
	cli("s3", "mb", "s3://clibkt")
	cli("s3", "cp", filepath.Join(work, "big"), "s3://clibkt/big")
	cli("s3", "cp", "s3://clibkt/big", filepath.Join(work, "big.out"))
	if got, _ := os.ReadFile(filepath.Join(work, "big.out")); !bytes.Equal(got, big) {
		t.Fatal("cp: the object read back differs")
	}
	if got, _ := os.ReadFile(filepath.Join(e.dir, "clibkt", "big")); !bytes.Equal(got, big) {
		t.Fatal("cp: the stored object differs")
	}
	cli("s3", "sync", src, "s3://clibkt/tree")
	dst := filepath.Join(work, "back")
	cli("s3", "sync", "s3://clibkt/tree", dst)
	for name, b := range files {
		if got, err := os.ReadFile(filepath.Join(dst, name)); err != nil || !bytes.Equal(got, b) {
			t.Errorf("sync: %s differs: %v", name, err)
		}
	}
	if ls := cli("s3", "ls", "s3://clibkt/"); !strings.Contains(ls, " big") || !strings.Contains(ls, "PRE tree/") {
		t.Errorf("ls: %s", ls)
	}
	if ls := cli("s3", "ls"); !strings.Contains(ls, "clibkt") {
		t.Errorf("ls of the buckets: %s", ls)
	}
	cli("s3", "rm", "--recursive", "s3://clibkt")
	cli("s3", "rb", "s3://clibkt")
	if ls := cli("s3", "ls"); strings.Contains(ls, "clibkt") {
		t.Errorf("ls after rb: %s", ls)
	}
}
