package cuobj

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/goroce/goroce/ib"
)

func sampleToken() Token {
	return Token{Addr: 0x7f00deadbeef0000, Size: 4096, RKey: 0x1234abcd, LID: 18516, QPN: 0xabcdef,
		HasGID: true, GID: ib.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))}
}

func TestTokenRoundTrip(t *testing.T) {
	for _, tok := range []Token{
		sampleToken(),
		{Addr: 1, Size: MaxRegSize, RKey: 0, LID: 0, QPN: 0xFFFFFF, HasGID: true, GID: ib.GIDFromAddr(netip.MustParseAddr("fd00::10"))},
		{Addr: 0x1000, Size: 1},
	} {
		s := tok.String()
		if len(s) != TokenLen || TokenLen != 81 {
			t.Fatalf("%q: %d bytes, want 81", s, len(s))
		}
		got, err := ParseToken(s)
		if err != nil || got != tok {
			t.Fatalf("ParseToken(%q) = %+v, %v; want %+v", s, got, err, tok)
		}
	}
	// The printf shape of the public integrations, field by field.
	want := "7f00deadbeef0000:00001000:1234abcd:4854:abcdef:1:00000000000000000000ffff0a000002"
	if s := sampleToken().String(); s != want {
		t.Fatalf("token %q, want %q", s, want)
	}
}

func TestParseTokenRejects(t *testing.T) {
	good := sampleToken().String()
	set := func(i int, c byte) string { b := []byte(good); b[i] = c; return string(b) }
	noGID := Token{Addr: 0x1000, Size: 1}.String()
	cases := []struct {
		name, s, field string
	}{
		{"empty", "", "length"},
		{"truncated", good[:80], "length"},
		{"long", good + "0", "length"},
		{"upper case", strings.ToUpper(good), "raddr"},
		{"space", set(3, ' '), "raddr"},
		{"separator", set(16, '-'), "separator"},
		{"rsize digit", set(20, 'g'), "rsize"},
		{"rkey digit", set(30, 'X'), "rkey"},
		{"lid digit", set(37, ':'), "lid"},
		{"qp digit", set(45, 'z'), "qp"},
		{"has_gid 2", set(TokenLen-34, '2'), "has_gid"},
		{"gid digit", set(TokenLen-1, 'G'), "gid"},
		{"zero size", "0000000000001000:00000000:00000000:0000:000000:0:00000000000000000000000000000000", "rsize"},
		{"size over limit", "0000000000001000:ffff0001:00000000:0000:000000:0:00000000000000000000000000000000", "rsize"},
		{"wraps", "fffffffffffff000:00002000:00000000:0000:000000:0:00000000000000000000000000000000", "raddr"},
		{"gid without has_gid", noGID[:TokenLen-1] + "1", "gid"},
		{"unspecified gid", noGID[:TokenLen-34] + "1" + noGID[TokenLen-33:], "gid"},
		{"multicast gid", noGID[:TokenLen-34] + "1:ff020000000000000000000000000001", "gid"},
		{"v4 broadcast gid", noGID[:TokenLen-34] + "1:00000000000000000000ffffffffffff", "gid"},
	}
	for _, c := range cases {
		_, err := ParseToken(c.s)
		var te *TokenError
		if !errors.As(err, &te) || !errors.Is(err, ErrToken) {
			t.Errorf("%s: ParseToken(%q) = %v, want a TokenError", c.name, c.s, err)
			continue
		}
		if te.Field != c.field {
			t.Errorf("%s: field %q (%v), want %q", c.name, te.Field, err, c.field)
		}
	}
	if _, err := (&Token{QPN: 1 << 24}).AppendText(nil); !errors.Is(err, ErrToken) {
		t.Errorf("25-bit QPN printed: %v", err)
	}
}

func TestTokenContains(t *testing.T) {
	tok := Token{Addr: 1000, Size: 100}
	for _, c := range []struct {
		addr, size uint64
		ok         bool
	}{
		{1000, 100, true}, {1000, 1, true}, {1099, 1, true}, {1050, 50, true},
		{999, 1, false}, {1000, 101, false}, {1099, 2, false}, {1100, 1, false},
		{1001, ^uint64(0), false}, {^uint64(0), 1, false},
	} {
		if got := tok.Contains(c.addr, c.size); got != c.ok {
			t.Errorf("Contains(%d, %d) = %v, want %v", c.addr, c.size, got, c.ok)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add(sampleToken().String())
	f.Add(Token{Addr: 0x1000, Size: 1}.String())
	f.Add("")
	f.Add(strings.Repeat(":", TokenLen))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrToken) {
				t.Fatalf("error %v is not ErrToken", err)
			}
			return
		}
		// Strict: what parses prints back to the same bytes.
		if back := tok.String(); back != s {
			t.Fatalf("ParseToken(%q) prints back as %q", s, back)
		}
		if tok.Size == 0 || uint64(tok.Size) > MaxRegSize || !tok.Contains(tok.Addr, uint64(tok.Size)) {
			t.Fatalf("accepted bad region %+v", tok)
		}
	})
}
