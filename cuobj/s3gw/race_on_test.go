//go:build race

package s3gw

// raceEnabled: the race detector multiplies the process's memory, so
// RSS bounds do not apply.
const raceEnabled = true
