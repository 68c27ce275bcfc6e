// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cliflag parses and validates the flags of rocectl's commands.
//
// Every command parses with Parse, which accepts flags after operands (as
// getopt does), then checks each flag the user set against the limits table
// (limits.go) before anything is allocated or opened. A violated limit is one
// line naming the flag, "rocectl perf: -s 99999999999: must be at most
// 4294901760 (the registration limit)", and the command exits 2.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// ErrParseOnly is what Parse returns, having parsed and validated, while
// ParseOnly is set: fuzzing and tests drive parsing without running a command.
var ErrParseOnly = errors.New("cliflag: parse only")

// ParseOnly makes Parse stop every command after validation.
var ParseOnly bool

// Parse parses args into fs, flags and operands in any order ("--" ends the
// flags), and validates the flags that were set against the limits of the
// flag set's name. Errors have been printed to fs.Output() when it returns.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(Reorder(fs, args)); err != nil {
		return err
	}
	if err := Validate(fs); err != nil {
		fmt.Fprintf(fs.Output(), "rocectl %s: %v\n", fs.Name(), err)
		return err
	}
	if ParseOnly {
		return ErrParseOnly
	}
	return nil
}

// Reorder moves the flags of args before its operands, so that flag.Parse,
// which stops at the first operand, sees them all. Operands keep their order
// and follow a "--", so an operand that looks like a flag stays one.
func Reorder(fs *flag.FlagSet, args []string) []string {
	var flags, operands []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			operands = append(operands, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			operands = append(operands, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		// A flag that takes a value takes the next argument with it.
		if f := fs.Lookup(name); f != nil && !isBool(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if len(operands) == 0 {
		return flags
	}
	return append(append(flags, "--"), operands...)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Validate checks each flag set in fs against its limits.
func Validate(fs *flag.FlagSet) error {
	rules := limits[fs.Name()]
	var err error
	fs.Visit(func(f *flag.Flag) {
		check, ok := rules[f.Name]
		if !ok || err != nil {
			return
		}
		if e := check(f.Value.String()); e != nil {
			err = fmt.Errorf("-%s %s: %w", f.Name, f.Value.String(), e)
		}
	})
	if err != nil {
		return err
	}
	for _, p := range products[fs.Name()] {
		a, b := fs.Lookup(p[0]), fs.Lookup(p[1])
		if a == nil || b == nil {
			continue
		}
		x, errA := strconv.ParseUint(a.Value.String(), 10, 64)
		y, errB := strconv.ParseUint(b.Value.String(), 10, 64)
		if errA != nil || errB != nil {
			continue // negative: refused above where set; a default never is
		}
		hi, lo := bits.Mul64(x, y)
		if e := CheckMemory(lo); hi != 0 || e != nil {
			if e == nil {
				e = CheckMemory(math.MaxUint64)
			}
			return fmt.Errorf("-%s %d × -%s %d: %w", p[0], x, p[1], y, e)
		}
	}
	return nil
}
