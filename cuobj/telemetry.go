package cuobj

import (
	"context"
	"io"
	"log/slog"
)

// TelemFlags select the telemetry messages (setTelemFlags).
type TelemFlags uint

// Telemetry flags.
const (
	LogPathInfo  TelemFlags = 0x0001 // CUOBJ_LOG_PATH_INFO
	LogPathDebug TelemFlags = 0x0002 // CUOBJ_LOG_PATH_DEBUG
	LogPathError TelemFlags = 0x0004 // CUOBJ_LOG_PATH_ERROR
)

// Telemetry configures the message stream of a client or server
// (setupTelemetry/setTelemFlags). The zero value logs errors to
// slog.Default(). OpenTelemetry comes in through package cuobjotel: its
// slog handler (for Logger) counts the messages and it exports
// ClientStats and ServerStats as metrics, so this package does not
// depend on OpenTelemetry.
type Telemetry struct {
	// Logger receives the messages; if nil, Writer (a text stream) or
	// else slog.Default() does.
	Logger *slog.Logger
	Writer io.Writer
	// Flags selects the messages (0: LogPathError). Use Off to log nothing.
	Flags TelemFlags
	// Off disables every message (setTelemFlags(0)).
	Off bool
}

type telemetry struct {
	log   *slog.Logger
	flags TelemFlags
}

func newTelemetry(t *Telemetry, component string) *telemetry {
	var cfg Telemetry
	if t != nil {
		cfg = *t
	}
	tm := &telemetry{flags: cfg.Flags}
	if cfg.Off {
		tm.flags = 0
	} else if tm.flags == 0 {
		tm.flags = LogPathError
	}
	switch {
	case cfg.Logger != nil:
		tm.log = cfg.Logger
	case cfg.Writer != nil:
		tm.log = slog.New(slog.NewTextHandler(cfg.Writer, &slog.HandlerOptions{Level: slog.LevelDebug}))
	default:
		tm.log = slog.Default()
	}
	tm.log = tm.log.With("component", component)
	return tm
}

func (t *telemetry) on(f TelemFlags) bool { return t != nil && t.flags&f != 0 }

func (t *telemetry) emit(f TelemFlags, lvl slog.Level, msg string, args ...any) {
	if t == nil || t.flags&f == 0 {
		return
	}
	t.log.Log(context.Background(), lvl, msg, args...)
}

func (t *telemetry) info(msg string, args ...any) { t.emit(LogPathInfo, slog.LevelInfo, msg, args...) }
func (t *telemetry) debug(msg string, args ...any) {
	t.emit(LogPathDebug, slog.LevelDebug, msg, args...)
}
func (t *telemetry) error(msg string, args ...any) {
	t.emit(LogPathError, slog.LevelError, msg, args...)
}
