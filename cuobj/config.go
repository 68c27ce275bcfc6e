package cuobj

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/tailscale/hujson"
)

// ConfigEnv names the JSON configuration file of the client.
const ConfigEnv = "CUFILE_ENV_PATH_JSON"

// Config is the client's JSON configuration (the file CUFILE_ENV_PATH_JSON
// names). Absent fields take the documented defaults; out-of-range values
// are capped as documented (Notes lists what was changed).
type Config struct {
	Logging    LoggingConfig    `json:"logging"`
	Properties PropertiesConfig `json:"properties"`
	// Notes says which values were capped or replaced.
	Notes []string `json:"-"`
}

// LoggingConfig is the "logging" object.
type LoggingConfig struct {
	Level string `json:"level"` // default "ERROR"
	// MaxFileSizeMB: -1 (no limit) or 1 … 4096 (default 32); also
	// CUFILE_LOGFILE_MAX_SIZE_MB.
	MaxFileSizeMB int `json:"max_file_size_mb"`
}

// PropertiesConfig is the "properties" object.
type PropertiesConfig struct {
	// DevAddrList lists client RDMA devices: IPv4, IPv6 (with a zone for
	// link-local), or interface/device names. It selects and orders the
	// client's devices (NewClient's and ClientOptions.Backups), the first
	// being the primary; an entry that names none of them is skipped, and
	// a list that names none is refused with ENODEV.
	DevAddrList []string `json:"rdma_dev_addr_list"`
	// PeerType is "nvidia_peermem" (default) or "dmabuf"; also
	// CUFILE_DMABUF_ENABLE, applied after the file. No effect without GPUs.
	PeerType            string `json:"rdma_peer_type"`
	MultipathEnabled    bool   `json:"rdma_multipath_enabled"`        // default false
	MaxBackupDevices    uint   `json:"rdma_max_backup_devices"`       // default 2, cap 8
	IORetryCount        uint   `json:"rdma_io_retry_count"`           // default 3, cap 10
	IORetryDelayMS      uint   `json:"rdma_io_retry_delay_ms"`        // default 100, cap 10000
	FailbackEnabled     bool   `json:"rdma_failback_enabled"`         // default true
	FailbackDelayMS     uint   `json:"rdma_failback_delay_ms"`        // default 100, cap 60000
	HealthCheckInterval uint   `json:"rdma_health_check_interval_ms"` // default 100, 100 … 60000
	AsyncEventMonitor   bool   `json:"rdma_async_event_monitoring"`   // default true
	UnhealthyThreshold  uint   `json:"rdma_unhealthy_threshold"`      // default 3, 1 … 100
	// TransportType selects the transport ("rc" or "dc"; default "rc" here).
	TransportType string `json:"rdma_transport_type"`
	// DCKey is the 32-bit DC key in hex (default "0xffeeddcc"); DC only.
	DCKey string `json:"rdma_dc_key"`
	// AccessMask (default 0x1f): bit0 local write, bit1 remote write, bit2
	// remote read, bit3 remote atomics, bit4 relaxed ordering.
	AccessMask string `json:"rdma_access_mask"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Logging: LoggingConfig{Level: "ERROR", MaxFileSizeMB: 32},
		Properties: PropertiesConfig{PeerType: "nvidia_peermem", MaxBackupDevices: 2, IORetryCount: 3,
			IORetryDelayMS: 100, FailbackEnabled: true, FailbackDelayMS: 100, HealthCheckInterval: 100,
			AsyncEventMonitor: true, UnhealthyThreshold: 3, TransportType: "rc", DCKey: "0xffeeddcc", AccessMask: "0x1f"},
	}
}

// LoadConfig reads the file CUFILE_ENV_PATH_JSON names (defaults when it
// is unset), then applies CUFILE_LOGFILE_MAX_SIZE_MB and
// CUFILE_DMABUF_ENABLE.
func LoadConfig() (*Config, error) {
	var data []byte
	if p := os.Getenv(ConfigEnv); p != "" {
		var err error
		if data, err = os.ReadFile(p); err != nil {
			return nil, fmt.Errorf("cuobj: %s: %w", ConfigEnv, err)
		}
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, err
	}
	if v := os.Getenv("CUFILE_LOGFILE_MAX_SIZE_MB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("cuobj: CUFILE_LOGFILE_MAX_SIZE_MB=%q: %w", v, err)
		}
		cfg.Logging.MaxFileSizeMB = n
	}
	switch strings.ToUpper(os.Getenv("CUFILE_DMABUF_ENABLE")) {
	case "TRUE":
		cfg.Properties.PeerType = "dmabuf"
	case "FALSE":
		cfg.Properties.PeerType = "nvidia_peermem"
	}
	return cfg, cfg.check()
}

// ParseConfig parses a configuration (empty data: the defaults) written as
// NVIDIA ships cufile.json: JSON with // and /* */ comments and trailing
// commas. Sections other than logging and properties (profile, execution,
// fs, ...) and the cuFile properties goroce has no use for are ignored,
// each with a note in Notes; a misspelt rdma_ property, a wrong type and
// trailing data are errors.
func ParseConfig(data []byte) (*Config, error) {
	cfg := DefaultConfig()
	if len(bytes.TrimSpace(data)) == 0 {
		return &cfg, cfg.check()
	}
	std, err := hujson.Standardize(append([]byte(nil), data...))
	if err != nil {
		return nil, fmt.Errorf("cuobj: config: %w", err)
	}
	var sections map[string]json.RawMessage
	if err := strictDecode(std, &sections); err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(sections) {
		raw := sections[name]
		var into any
		switch name {
		case "logging":
			into = &cfg.Logging
		case "properties":
			into = &cfg.Properties
		default:
			cfg.Notes = append(cfg.Notes, fmt.Sprintf("section %q ignored", name))
			continue
		}
		var keys map[string]json.RawMessage
		if err := strictDecode(raw, &keys); err != nil {
			return nil, fmt.Errorf("%w (section %q)", err, name)
		}
		known := jsonFields(into)
		for _, k := range sortedKeys(keys) {
			switch {
			case known[k]:
			case name == "properties" && strings.HasPrefix(k, "rdma_"):
				return nil, fmt.Errorf("cuobj: config: unknown property %q", k)
			default:
				cfg.Notes = append(cfg.Notes, fmt.Sprintf("%s.%s ignored", name, k))
			}
		}
		if err := json.Unmarshal(raw, into); err != nil {
			return nil, fmt.Errorf("cuobj: config: %s: %w", name, err)
		}
	}
	return &cfg, cfg.check()
}

// strictDecode decodes one JSON value and refuses data after it.
func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("cuobj: config: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("cuobj: config: data after the JSON object")
	}
	return nil
}

// jsonFields is the set of JSON names of the struct v points to.
func jsonFields(v any) map[string]bool {
	t := reflect.TypeOf(v).Elem()
	m := map[string]bool{}
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			m[name] = true
		}
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// check applies the caps and refuses what cannot be capped.
func (c *Config) check() error {
	p := &c.Properties
	capU := func(name string, v *uint, lo, hi uint) {
		switch {
		case *v > hi:
			c.Notes = append(c.Notes, fmt.Sprintf("%s %d capped to %d", name, *v, hi))
			*v = hi
		case *v < lo:
			c.Notes = append(c.Notes, fmt.Sprintf("%s %d raised to %d", name, *v, lo))
			*v = lo
		}
	}
	capU("rdma_max_backup_devices", &p.MaxBackupDevices, 0, 8)
	capU("rdma_io_retry_count", &p.IORetryCount, 0, 10)
	capU("rdma_io_retry_delay_ms", &p.IORetryDelayMS, 0, 10000)
	capU("rdma_failback_delay_ms", &p.FailbackDelayMS, 0, 60000)
	capU("rdma_health_check_interval_ms", &p.HealthCheckInterval, 100, 60000)
	capU("rdma_unhealthy_threshold", &p.UnhealthyThreshold, 1, 100)
	if m := c.Logging.MaxFileSizeMB; m != -1 && (m < 1 || m > 4096) {
		return fmt.Errorf("cuobj: config: logging.max_file_size_mb %d: want -1 or 1 … 4096", m)
	}
	switch strings.ToUpper(c.Logging.Level) {
	case "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "NOTICE", "FATAL":
	default:
		return fmt.Errorf("cuobj: config: logging.level %q", c.Logging.Level)
	}
	if p.PeerType != "dmabuf" && p.PeerType != "nvidia_peermem" {
		return fmt.Errorf("cuobj: config: rdma_peer_type %q: want \"dmabuf\" or \"nvidia_peermem\"", p.PeerType)
	}
	switch strings.ToLower(p.TransportType) {
	case "rc", "dc", "":
	default:
		return fmt.Errorf("cuobj: config: rdma_transport_type %q: want \"rc\" or \"dc\"", p.TransportType)
	}
	if _, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(p.DCKey), "0x"), 16, 32); err != nil {
		return fmt.Errorf("cuobj: config: rdma_dc_key %q is not a 32-bit hex value", p.DCKey)
	}
	if v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(p.AccessMask), "0x"), 16, 8); err != nil || v > 0x1f {
		return fmt.Errorf("cuobj: config: rdma_access_mask %q: want hex 0 … 0x1f", p.AccessMask)
	}
	for _, d := range p.DevAddrList {
		if _, err := ParseDevAddr(d); err != nil {
			return err
		}
	}
	return nil
}

// DevAddr is one entry of rdma_dev_addr_list: an address (IPv6 link-local
// with its zone) or a device/interface name.
type DevAddr struct {
	Addr netip.Addr // valid for an address
	Name string     // otherwise
}

// ParseDevAddr parses an rdma_dev_addr_list entry. IPv6 addresses are
// plain literals: brackets are refused.
func ParseDevAddr(s string) (DevAddr, error) {
	if s == "" || strings.ContainsAny(s, "[] \t/") {
		return DevAddr{}, fmt.Errorf("cuobj: config: rdma_dev_addr_list entry %q", s)
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Is6() && a.IsLinkLocalUnicast() && a.Zone() == "" {
			return DevAddr{}, fmt.Errorf("cuobj: config: link-local %q needs a zone (fe80::1%%dev)", s)
		}
		return DevAddr{Addr: a}, nil
	}
	if strings.ContainsAny(s, ":%") || len(s) > 15 {
		return DevAddr{}, fmt.Errorf("cuobj: config: rdma_dev_addr_list entry %q is neither an address nor a device name", s)
	}
	return DevAddr{Name: s}, nil
}
