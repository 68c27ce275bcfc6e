package qp

// A work request names the address handle, window and region it uses
// through AHRef, MWRef and MRRef rather than as *AH, *MW and *MR, so that a
// layer wrapping the engine's objects (package roce's AH, MW and MR, which
// add the device's lock) can hand its callers' work requests to the engine
// as they are, without copying each into one that names the engine's
// objects. The interfaces' one method is unexported: they are implemented
// by the engine's objects and by wrappers that embed a Ref, nothing else.
type (
	// AHRef is an address handle: *AH, or a wrapper embedding Ref[AH].
	AHRef interface{ engineObj() *AH }
	// MWRef is a memory window: *MW, or a wrapper embedding Ref[MW].
	MWRef interface{ engineObj() *MW }
	// MRRef is a memory region: *MR, or a wrapper embedding Ref[MR].
	MRRef interface{ engineObj() *MR }
)

// Ref, embedded in a wrapper of an engine object, makes the wrapper stand
// for that object in a work request. A wrapper is never nil inside an
// interface when the engine sees it: its owner checks that first.
type Ref[T any] struct{ p *T }

// NewRef returns the Ref for the engine object p.
func NewRef[T any](p *T) Ref[T] { return Ref[T]{p} }

func (r *Ref[T]) engineObj() *T { return r.p }

func (a *AH) engineObj() *AH { return a }
func (w *MW) engineObj() *MW { return w }
func (m *MR) engineObj() *MR { return m }

// ahOf, mwOf and mrOf resolve a reference; nil stays nil.
func ahOf(r AHRef) *AH {
	if r == nil {
		return nil
	}
	return r.engineObj()
}

func mwOf(r MWRef) *MW {
	if r == nil {
		return nil
	}
	return r.engineObj()
}

func mrOf(r MRRef) *MR {
	if r == nil {
		return nil
	}
	return r.engineObj()
}
