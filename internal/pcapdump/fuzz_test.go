package pcapdump

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

// FuzzDecode feeds arbitrary frames to the decoder: it must never panic, and
// every record it produces must encode as JSON and summarise.
func FuzzDecode(f *testing.F) {
	frames, _ := sampleFrames(f)
	for _, fr := range frames {
		f.Add(fr)
		f.Add(fr[:len(fr)-5])
		f.Add(fr[:14+20+8+3])
	}
	f.Add([]byte{})
	f.Add(make([]byte, 60))
	var d Decoder
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Record
		d.Decode(Frame{Number: 1, LinkType: layers.LinkTypeEthernet, Data: data}, &r)
		b, err := json.Marshal(&r)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back Record
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", b, err)
		}
		if back.Error != r.Error || back.PSN != r.PSN || back.ICRCOK != r.ICRCOK {
			t.Fatalf("JSON round trip changed the record: %s", b)
		}
		_ = Summary(&r)
	})
}

// FuzzReadFrames feeds arbitrary files to the pcap/pcapng reader: it must
// return an error, never panic.
func FuzzReadFrames(f *testing.F) {
	frames, _ := sampleFrames(f)
	for _, path := range []string{writePCAP(f, frames), writePCAPNG(f, frames)} {
		if b, err := os.ReadFile(path); err == nil {
			f.Add(b)
			f.Add(b[:len(b)/2])
		}
	}
	f.Add([]byte{0xa1, 0xb2, 0xc3, 0xd4})
	f.Add([]byte{0x0a, 0x0d, 0x0d, 0x0a})
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		_ = ReadFrames(bytes.NewReader(data), func(fr Frame) error {
			n++
			if fr.Number != n {
				t.Fatalf("frame number %d, want %d", fr.Number, n)
			}
			return nil
		})
	})
}
