//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import (
	"os"
	"os/exec"
	"time"
)

// runSupported reports whether this system can run commands under a lock:
// it needs process groups and signals, which it lacks.
const runSupported = false

var (
	sigTERM   os.Signal = os.Interrupt
	sigKILL   os.Signal = os.Kill
	forwarded           = []os.Signal{os.Interrupt}
)

func terminalWidth(int) int                 { return 0 }
func isTerminal(int) bool                   { return false }
func setupChild(*exec.Cmd) bool             { return false }
func startedInForeground()                  {}
func restoreForeground()                    {}
func signalGroup(int, os.Signal)            {}
func waitGroupGone(int, time.Duration) bool { return true }
func exitStatus(ps *os.ProcessState) int    { return ps.ExitCode() }
func signalStatus(os.Signal) int            { return exitError }
