package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
)

// command is one rocectl subcommand. run receives the arguments after the
// command name and returns the process exit status.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is the command table. Each command's file adds its entry from an
// init function, so adding a command touches no other file.
var commands = map[string]command{}

func register(name string, c command) {
	if _, dup := commands[name]; dup {
		panic("rocectl: command registered twice: " + name)
	}
	commands[name] = c
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches args (without the program name) to a command and returns the
// exit status: 0 success, 1 the command failed, 2 usage error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version())
		return 0
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				// Every command prints its flag usage on -h.
				return c.run([]string{"-h"}, stdout, stdout)
			}
			fmt.Fprintf(stderr, "rocectl: unknown command %q\n", args[1])
			return 2
		}
		usage(stdout)
		return 0
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "rocectl: unknown command %q\n", name)
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: rocectl <command> [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nrun 'rocectl help <command>' for a command's flags, 'rocectl --version' for the build")
}

// version is the module version and the VCS revision the binary was built
// from, as the go command stamped them.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "rocectl (no build information)"
	}
	v := "rocectl " + bi.Main.Version
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if r := settings["vcs.revision"]; r != "" {
		v += " " + r
		if settings["vcs.modified"] == "true" {
			v += " (modified)"
		}
		if t := settings["vcs.time"]; t != "" {
			v += " " + t
		}
	}
	return v + " " + bi.GoVersion
}
