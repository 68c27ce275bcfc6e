package rsocket

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"

	"github.com/goroce/goroce/link/faultnet"
)

func TestIOMap(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	o := Options{IOMapSize: 2}
	c, s, _ := connPair(t, da, db, &Dialer{Options: o}, &ListenConfig{Options: o})
	target := make([]byte, 300000)
	if off, err := s.IOMap(target, true, 4096); err != nil || off != 4096 {
		t.Fatalf("IOMap: %d %v", off, err)
	}
	// Nothing mapped on the client's side yet: its IOWrite has no target.
	if _, err := c.IOWrite([]byte("x"), 4096); !errors.Is(err, ErrNoIOMap) {
		t.Fatalf("IOWrite before the map arrived: %v", err)
	}
	// The map travels with the next write.
	if _, err := s.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	if _, err := io.ReadFull(c, one[:]); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, len(target)-10)
	rand.Read(data)
	if n, err := c.IOWrite(data, 4096+10); err != nil || n != len(data) {
		t.Fatalf("IOWrite: %d %v", n, err)
	}
	// Past the end of the mapping: only what fits is written.
	if n, err := c.IOWrite(make([]byte, 20), 4096+int64(len(target))-5); err != nil || n != 5 {
		t.Fatalf("IOWrite across the end: %d %v", n, err)
	}
	// Stream data written after the IOWrite arrives after it.
	if _, err := c.Write([]byte{2}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, one[:]); err != nil || one[0] != 2 {
		t.Fatalf("notification %v %v", one, err)
	}
	if !bytes.Equal(target[10:len(target)-5], data[:len(data)-5]) {
		t.Fatal("iomapped buffer does not hold what was written")
	}
	if err := s.IOUnmap(target); err != nil {
		t.Fatal(err)
	}
	if err := s.IOUnmap(target); err == nil {
		t.Fatal("second IOUnmap succeeded")
	}
	// The stream still works both ways.
	copyBoth(t, c, s, 1<<20)
}
