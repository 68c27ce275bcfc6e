package cuobj

import "fmt"

// String prints the counters by name: %v on the struct itself would show
// the atomics' internals.
func (s *ClientStats) String() string {
	return fmt.Sprintf("gets=%d puts=%d get_bytes=%d put_bytes=%d callbacks=%d retries=%d "+
		"connections=%d refused=%d strangers=%d handshake_failures=%d failovers=%d failbacks=%d",
		s.Gets.Load(), s.Puts.Load(), s.GetBytes.Load(), s.PutBytes.Load(), s.Callbacks.Load(), s.Retries.Load(),
		s.Connections.Load(), s.Refused.Load(), s.Strangers.Load(), s.HandshakeFailures.Load(), s.Failovers.Load(), s.Failbacks.Load())
}
