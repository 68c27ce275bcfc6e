// Command rocectl inspects and exercises goroce: it decodes RoCEv2 captures
// and, as the stack grows, drives links, devices and test traffic.
//
// Usage:
//
//	rocectl <command> [flags] [args]
//	rocectl help [command]
//
// Each command lives in its own file and registers itself in the command
// table (see main.go). Commands whose logic other packages need in-process
// (the wirecheck cross-checks call the pcap decoder) keep that logic in an
// importable subpackage, since package main cannot be imported.
package main
