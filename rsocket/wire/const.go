package wire

import "time"

// Sizes and limits, as librdmacm's rsocket.c defines them.
const (
	ConnDataLen   = 40 // sizeof(struct rs_conn_data)
	ConnVersion   = 1  // rs_conn_data.version
	SGELen        = 16 // sizeof(struct rs_sge): addr, key, length
	IOMapEntryLen = 24 // sizeof(struct rs_iomap): offset, rs_sge
	SGLSize       = 2  // RS_SGL_SIZE: entries in a target SGL

	OlapStartSize = 2048   // RS_OLAP_START_SIZE: first chunk of an rsend
	MaxTransfer   = 65536  // RS_MAX_TRANSFER: chunk size cap
	SndLowat      = 2048   // RS_SNDLOWAT: free send buffer needed to send
	QPMinSize     = 16     // RS_QP_MIN_SIZE
	QPMaxSize     = 0xFFFE // RS_QP_MAX_SIZE
	QPCtrlSize    = 4      // RS_QP_CTRL_SIZE: send slots kept for control messages
	ConnRetries   = 6      // RS_CONN_RETRIES: route resolution retries

	// ImmDataMask selects the 29 data bits of an immediate.
	ImmDataMask = 0x1FFFFFFF
	// MaxIOMapSize is the largest iomap entry count the 8-bit scaled
	// target_iomap_size can carry ((0x7F) << 8).
	MaxIOMapSize = 0x7F << 8
)

// Defaults of rsocket.c (def_* statics), overridable there through files in
// /etc/rdma/rsocket.
const (
	DefaultSQSize         = 384
	DefaultRQSize         = 384
	DefaultInline         = 64
	DefaultRMem           = 1 << 17 // receive buffer, bytes (mem_default)
	DefaultWMem           = 1 << 17 // send buffer, bytes (wmem_default)
	DefaultIOMapSize      = 0
	DefaultPollingTime    = 10 * time.Microsecond
	DefaultWakeUpInterval = 500 * time.Millisecond
	// MinSndBuf is the smallest send buffer SO_SNDBUF yields.
	MinSndBuf = 4096
)

// Socket options (rsocket.h).
const (
	SolRDMA        = 0x10000
	OptSQSize      = 0    // RDMA_SQSIZE
	OptRQSize      = 1    // RDMA_RQSIZE
	OptInline      = 2    // RDMA_INLINE
	OptIOMapSize   = 3    // RDMA_IOMAPSIZE
	OptRoute       = 4    // RDMA_ROUTE
	DefaultPort    = 7471 // rstream, riostream
	RcopyPort      = 7427
	UdpongPort     = 7174
	CMAHeaderLen   = 36 // kernel cma_hdr in front of REQ private data
	MaxREQUserData = 56 // RDMA_PS_TCP user private data in a REQ
)

// ConnFlags is rs_conn_data.flags.
type ConnFlags uint8

const (
	// ConnFlagNet: the sender is a big-endian host; SGEs and iomap entries
	// written into its target SGL must be big-endian.
	ConnFlagNet ConnFlags = 1 << 0
	// ConnFlagIOMap: the iomap table follows the target SGL (always set by
	// librdmacm).
	ConnFlagIOMap ConnFlags = 1 << 1
)

// ClampQPSize clamps a requested SQ/RQ size to [RS_QP_MIN_SIZE,
// min(devMax, RS_QP_MAX_SIZE)] as rs_set_qp_size does. devMax <= 0 means no
// device limit.
func ClampQPSize(n, devMax int) int {
	max := QPMaxSize
	if devMax > 0 && devMax < max {
		max = devMax
	}
	if n > max {
		return max
	}
	if n < QPMinSize {
		return QPMinSize
	}
	return n
}

// IOMapSizeToScale encodes an iomap entry count into the 8-bit
// target_iomap_size (rs_value_to_scale(v, 8)): counts up to 128 as-is,
// larger ones as 0x80|(v>>8), which rounds down to a multiple of 256.
func IOMapSizeToScale(v int) uint8 {
	if v < 0 {
		v = 0
	}
	if v <= 128 {
		return uint8(v)
	}
	return uint8(0x80 | v>>8)
}

// IOMapSizeFromScale decodes target_iomap_size (rs_scale_to_value(b, 8)).
func IOMapSizeFromScale(b uint8) int {
	if b <= 128 {
		return int(b)
	}
	return int(b&0x7F) << 8
}
