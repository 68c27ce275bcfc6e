package cuobj

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigDefaultsAndCaps(t *testing.T) {
	d, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := d.Properties
	if d.Logging.MaxFileSizeMB != 32 || d.Logging.Level != "ERROR" || p.PeerType != "nvidia_peermem" ||
		p.MultipathEnabled || p.MaxBackupDevices != 2 || p.IORetryCount != 3 || p.IORetryDelayMS != 100 ||
		!p.FailbackEnabled || p.FailbackDelayMS != 100 || p.HealthCheckInterval != 100 || !p.AsyncEventMonitor ||
		p.UnhealthyThreshold != 3 || len(p.DevAddrList) != 0 {
		t.Fatalf("defaults %+v", d)
	}
	c, err := ParseConfig([]byte(`{"logging": {"level": "INFO", "max_file_size_mb": -1},
	  "properties": {"rdma_dev_addr_list": ["192.168.1.10", "fd00::10", "fe80::1%mlx5_0", "mlx5_1"],
	  "rdma_peer_type": "dmabuf", "rdma_multipath_enabled": true, "rdma_max_backup_devices": 9,
	  "rdma_io_retry_count": 11, "rdma_io_retry_delay_ms": 10001, "rdma_failback_delay_ms": 60001,
	  "rdma_health_check_interval_ms": 99, "rdma_unhealthy_threshold": 0}}`))
	if err != nil {
		t.Fatal(err)
	}
	p = c.Properties
	if p.MaxBackupDevices != 8 || p.IORetryCount != 10 || p.IORetryDelayMS != 10000 || p.FailbackDelayMS != 60000 ||
		p.HealthCheckInterval != 100 || p.UnhealthyThreshold != 1 || len(c.Notes) != 6 || !p.MultipathEnabled {
		t.Fatalf("caps: %+v %q", p, c.Notes)
	}
	if c, _ := ParseConfig([]byte(`{"properties": {"rdma_health_check_interval_ms": 60001, "rdma_unhealthy_threshold": 101}}`)); c.Properties.HealthCheckInterval != 60000 || c.Properties.UnhealthyThreshold != 100 {
		t.Fatalf("upper caps: %+v", c.Properties)
	}
	for name, js := range map[string]string{
		"size 0":          `{"logging": {"max_file_size_mb": 0}}`,
		"size 4097":       `{"logging": {"max_file_size_mb": 4097}}`,
		"size -2":         `{"logging": {"max_file_size_mb": -2}}`,
		"level":           `{"logging": {"level": "LOUD"}}`,
		"peer type":       `{"properties": {"rdma_peer_type": "gdr"}}`,
		"bracketed v6":    `{"properties": {"rdma_dev_addr_list": ["[fd00::10]"]}}`,
		"link-local zone": `{"properties": {"rdma_dev_addr_list": ["fe80::1"]}}`,
		"empty entry":     `{"properties": {"rdma_dev_addr_list": [""]}}`,
		"unknown field":   `{"properties": {"rdma_bogus": 1}}`,
		"negative count":  `{"properties": {"rdma_io_retry_count": -1}}`,
		"trailing":        `{} {}`,
		"not JSON":        `{`,
		"dc key":          `{"properties": {"rdma_dc_key": "0x1ffffffff"}}`,
		"access mask":     `{"properties": {"rdma_access_mask": "0x20"}}`,
		"transport":       `{"properties": {"rdma_transport_type": "ud"}}`,
	} {
		if _, err := ParseConfig([]byte(js)); err == nil {
			t.Errorf("%s: accepted %s", name, js)
		}
	}
}

func TestLoadConfigEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cuobj.json")
	os.WriteFile(path, []byte(`{"properties": {"rdma_io_retry_count": 5}}`), 0o644)
	t.Setenv(ConfigEnv, path)
	t.Setenv("CUFILE_LOGFILE_MAX_SIZE_MB", "64")
	t.Setenv("CUFILE_DMABUF_ENABLE", "TRUE")
	c, err := LoadConfig()
	if err != nil || c.Properties.IORetryCount != 5 || c.Logging.MaxFileSizeMB != 64 || c.Properties.PeerType != "dmabuf" {
		t.Fatalf("%+v %v", c, err)
	}
	t.Setenv("CUFILE_LOGFILE_MAX_SIZE_MB", "5000")
	if _, err := LoadConfig(); err == nil {
		t.Error("CUFILE_LOGFILE_MAX_SIZE_MB=5000 accepted")
	}
	t.Setenv(ConfigEnv, filepath.Join(t.TempDir(), "missing.json"))
	if _, err := LoadConfig(); err == nil {
		t.Error("missing file accepted")
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"properties": {"rdma_dev_addr_list": ["fd00::10"]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		p := c.Properties
		if p.MaxBackupDevices > 8 || p.IORetryCount > 10 || p.IORetryDelayMS > 10000 || p.HealthCheckInterval < 100 ||
			p.UnhealthyThreshold < 1 || p.UnhealthyThreshold > 100 {
			t.Fatalf("caps not applied: %+v", p)
		}
	})
}

func TestTelemetry(t *testing.T) {
	var buf bytes.Buffer
	tm := newTelemetry(&Telemetry{Writer: &buf, Flags: LogPathError | LogPathInfo}, "x")
	tm.info("hello")
	tm.debug("hidden")
	tm.error("bad")
	out := buf.String()
	if !strings.Contains(out, "hello") || strings.Contains(out, "hidden") || !strings.Contains(out, "bad") || !strings.Contains(out, "component=x") {
		t.Fatalf("stream: %s", out)
	}
	buf.Reset()
	newTelemetry(&Telemetry{Writer: &buf, Off: true}, "x").error("bad")
	if buf.Len() != 0 {
		t.Fatal("Off logged")
	}
	buf.Reset()
	def := newTelemetry(&Telemetry{Logger: slog.New(slog.NewTextHandler(&buf, nil))}, "x")
	def.info("no")
	def.error("yes")
	if strings.Contains(buf.String(), "no") || !strings.Contains(buf.String(), "yes") {
		t.Fatalf("default flags log errors only: %s", buf.String())
	}
}

// TestParseConfigAsShipped: cufile.json as NVIDIA ships it, with comments,
// trailing commas and sections goroce has no use for.
func TestParseConfigAsShipped(t *testing.T) {
	c, err := ParseConfig([]byte(`{
	// NOTE : Application can override custom configuration via export CUFILE_ENV_PATH_JSON=<filepath>
	"logging": {
		// log directory, if not enabled will create log file under current working directory
		//"dir": "/home/<xxxx>",
		"level": "ERROR" // NOTICE|ERROR|WARN|INFO|DEBUG|TRACE
	},
	"profile": { "nvtx": false, "cufile_stats": 0 },
	"execution": { "max_io_queue_depth": 128, "parallel_io": true, },
	"properties": {
		/* max IO chunk size used by cuFileRead/Write internally per IO request */
		"max_direct_io_size_kb": 16384,
		"use_poll_mode": false,
		"rdma_dev_addr_list": [ ],
		"rdma_io_retry_count": 4,
	},
	"fs": { "generic": { "posix_unaligned_writes": false } },
}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Properties.IORetryCount != 4 || len(c.Notes) != 5 {
		t.Errorf("retry count %d, notes %q (want 4, and 5: three sections and two properties ignored)", c.Properties.IORetryCount, c.Notes)
	}
}
