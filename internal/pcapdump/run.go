package pcapdump

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
)

// Counts summarises one run.
type Counts struct {
	Frames, RoCE, BadICRC, Undecodable, NotRoCE int
}

func (c Counts) failed() bool { return c.BadICRC > 0 || c.Undecodable > 0 }

// Run is "rocectl pcap [--json] FILE...". It returns 0 when every RoCEv2
// frame decodes and carries a correct ICRC, 1 otherwise (or when a file
// cannot be read), 2 on a usage error. Frames that are not RoCEv2 at all
// (ARP, TCP, other UDP ports) are reported but do not fail the run.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pcap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.Bool("json", false, "write one JSON object per frame instead of a summary line")
	dc := fs.Bool("dc", false, "read the RD opcode space (0x40-0x5F) as DC, as Wireshark does (goroce's DC framing, docs/dc.md)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rocectl pcap [--json] [--dc] FILE...   (FILE - reads standard input)")
		fmt.Fprintln(fs.Output(), "Decodes every frame of pcap/pcapng files as RoCEv2. Exit status 1 if a RoCEv2")
		fmt.Fprintln(fs.Output(), "frame cannot be decoded or has a bad ICRC; other traffic is listed, not counted.")
		fs.PrintDefaults()
	}
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}

	w := bufio.NewWriter(stdout)
	defer w.Flush()
	status := 0
	multi := fs.NArg() > 1
	for _, name := range fs.Args() {
		if multi && !*jsonOut {
			fmt.Fprintf(w, "==> %s <==\n", name)
		}
		c, err := dumpFile(w, name, multi, *jsonOut, *dc)
		if !*jsonOut {
			fmt.Fprintf(w, "%d frames: %d RoCEv2, %d bad ICRC, %d undecodable, %d not RoCEv2\n",
				c.Frames, c.RoCE, c.BadICRC, c.Undecodable, c.NotRoCE)
		}
		if err != nil {
			w.Flush()
			fmt.Fprintf(stderr, "rocectl pcap: %s: %v\n", name, err)
			status = 1
			continue
		}
		if c.failed() {
			w.Flush()
			fmt.Fprintf(stderr, "rocectl pcap: %s: %d of %d frames failed: %d bad ICRC, %d undecodable (%d RoCEv2, %d not RoCEv2)\n",
				name, c.BadICRC+c.Undecodable, c.Frames, c.BadICRC, c.Undecodable, c.RoCE, c.NotRoCE)
			status = 1
		}
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintf(stderr, "rocectl pcap: %v\n", err)
		return 1
	}
	return status
}

func dumpFile(w *bufio.Writer, name string, multi, jsonOut, dc bool) (Counts, error) {
	var c Counts
	var in io.Reader = os.Stdin // "-", e.g. tcpdump -w - | rocectl pcap -
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return c, err
		}
		defer f.Close()
		in = f
	}
	var (
		d   = Decoder{DC: dc}
		rec Record
		enc = json.NewEncoder(w)
	)
	err := ReadFrames(in, func(fr Frame) error {
		rec.File = ""
		if multi {
			rec.File = name
		}
		d.Decode(fr, &rec)
		c.Frames++
		switch {
		case rec.NotRoCE:
			c.NotRoCE++
		case rec.Error != "":
			c.Undecodable++
		case !rec.ICRCOK:
			c.RoCE++
			c.BadICRC++
		default:
			c.RoCE++
		}
		if jsonOut {
			return enc.Encode(&rec)
		}
		_, err := io.WriteString(w, Summary(&rec)+"\n")
		return err
	})
	return c, err
}

// Summary is the one-line human form of a record.
func Summary(r *Record) string {
	var s strings.Builder
	fmt.Fprintf(&s, "%5d ", r.Frame)
	if r.Error != "" {
		s.WriteString("error: " + r.Error)
		return s.String()
	}
	fmt.Fprintf(&s, "%s > %s", r.Src, r.Dst)
	if r.VLAN != nil {
		fmt.Fprintf(&s, " vlan %d", *r.VLAN)
	}
	fmt.Fprintf(&s, " %s qp=%#06x psn=%d", r.OpcodeName, r.DestQP, r.PSN)
	flags := ""
	if r.AckReq {
		flags += "A"
	}
	if r.Solicited {
		flags += "S"
	}
	if r.MigReq {
		flags += "M"
	}
	if r.FECN {
		flags += "F"
	}
	if r.BECN {
		flags += "B"
	}
	if flags != "" {
		s.WriteString(" " + flags)
	}
	if r.PKey != 0xffff {
		fmt.Fprintf(&s, " pkey=%#04x", r.PKey)
	}
	if r.DCETH != nil {
		if r.DCETH.DCTN != 0 {
			fmt.Fprintf(&s, " dctn=%#x", r.DCETH.DCTN)
		} else {
			fmt.Fprintf(&s, " dckey=%#x", r.DCETH.Key)
		}
	}
	if r.DCCETH != nil {
		fmt.Fprintf(&s, " dci=%#x conn=%d", r.DCCETH.DCI, r.DCCETH.Conn)
		if r.DCCETH.Flags&ib.DCCDisconnect != 0 {
			s.WriteString(" disconnect")
		}
	}
	if r.RDETH != nil {
		fmt.Fprintf(&s, " eec=%#x", r.RDETH.EEC)
	}
	if r.DETH != nil {
		fmt.Fprintf(&s, " qkey=%#x srcqp=%#x", r.DETH.QKey, r.DETH.SrcQP)
	}
	if r.XRCETH != nil {
		fmt.Fprintf(&s, " srqn=%#x", r.XRCETH.SRQN)
	}
	if r.FETH != nil {
		fmt.Fprintf(&s, " flush(plt=%d sel=%d)", r.FETH.Placement, r.FETH.Selectivity)
	}
	if r.RETH != nil {
		fmt.Fprintf(&s, " va=%#x rkey=%#x dmalen=%d", r.RETH.VA, r.RETH.RKey, r.RETH.DMALen)
	}
	if r.Atomic != nil {
		fmt.Fprintf(&s, " va=%#x rkey=%#x swap_add=%#x cmp=%#x", r.Atomic.VA, r.Atomic.RKey, r.Atomic.SwapAdd, r.Atomic.Compare)
	}
	if r.AETH != nil {
		fmt.Fprintf(&s, " %s msn=%d", syndrome(r.AETH.Syndrome), r.AETH.MSN)
	}
	if r.AtomicAck != nil {
		fmt.Fprintf(&s, " orig=%#x", r.AtomicAck.Orig)
	}
	if r.Imm != nil {
		fmt.Fprintf(&s, " imm=%#08x", *r.Imm)
	}
	if r.IETH != nil {
		fmt.Fprintf(&s, " inv_rkey=%#x", *r.IETH)
	}
	fmt.Fprintf(&s, " len=%d", r.PayloadLen)
	if r.Pad != 0 {
		fmt.Fprintf(&s, "+%dpad", r.Pad)
	}
	if r.ICRCOK {
		s.WriteString(" icrc ok")
	} else {
		fmt.Fprintf(&s, " icrc BAD (%#08x)", r.ICRC)
	}
	return s.String()
}

// syndrome names an AETH syndrome byte.
func syndrome(b uint8) string {
	s := ib.Syndrome(b)
	switch s.Type() {
	case ib.SyndromeACK:
		if s.CreditCode() == 0x1f {
			return "ACK"
		}
		n, _ := ib.Credits(s.CreditCode())
		return fmt.Sprintf("ACK(credits=%d)", n)
	case ib.SyndromeRNRNAK:
		return fmt.Sprintf("RNR-NAK(%v)", s.RNRTimer().Duration())
	case ib.SyndromeNAK:
		return fmt.Sprintf("NAK(%d)", s.NAKCode())
	default:
		return fmt.Sprintf("syndrome=%#02x", b)
	}
}
