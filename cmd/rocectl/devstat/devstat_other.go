//go:build !linux

package devstat

import (
	"context"

	"github.com/goroce/goroce/roce"
)

// Publisher serves a device's counters until Close; off Linux there is
// none.
type Publisher struct{}

// Publish returns ErrNotSupported off Linux.
func Publish(dev *roce.Device, command string) (*Publisher, error) { return nil, ErrNotSupported }

// Snapshot returns nothing off Linux.
func (p *Publisher) Snapshot() Snapshot { return Snapshot{} }

// Close does nothing off Linux.
func (p *Publisher) Close() error { return nil }

// Query returns ErrNotSupported off Linux.
func Query(ctx context.Context, name string) (Snapshot, error) { return Snapshot{}, ErrNotSupported }

// List returns ErrNotSupported off Linux.
func List() ([]string, error) { return nil, ErrNotSupported }
