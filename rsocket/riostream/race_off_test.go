//go:build !race

package riostream

const raceEnabled = false
