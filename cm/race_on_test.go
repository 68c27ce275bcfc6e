//go:build race

package cm

const raceEnabled = true
