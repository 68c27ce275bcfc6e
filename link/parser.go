package link

import "github.com/goroce/goroce/ib"

// Parser is ParseFrame for a stream of frames, most of which repeat the
// headers of the frame before: ib.EncapParser with the link's errors. A
// frame whose header bytes, but for the lengths, IPv4 ID and checksums,
// equal those of the last frame parsed whole is checked by its lengths
// alone. The zero value is ready; a Parser is not safe for concurrent use.
type Parser struct {
	p ib.EncapParser
}

// Parse walks b as ParseFrame does and returns the same result, in a
// Frame owned by p and valid until the next call. same reports that b
// repeats the headers of the previous frame that parsed without error in
// every field of the Frame but Payload's length (End): a caller may keep
// what it derived from them.
func (p *Parser) Parse(b []byte) (f *Frame, same bool, err error) {
	f, same, err = p.p.Parse(b)
	if err != nil {
		return nil, false, frameErr(err)
	}
	return f, same, nil
}
