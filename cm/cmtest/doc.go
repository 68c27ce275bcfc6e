// Package cmtest helps test the users of package cm (rsocket, NAAICE,
// cuObject): a link that loses chosen CM MADs on their way out, so that a
// handshake never completes on one side, as on a lossy or hostile network.
package cmtest
