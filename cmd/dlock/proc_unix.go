//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
	"unsafe"
)

// runSupported reports whether this system can run commands under a lock:
// it needs process groups and signals.
const runSupported = true

var (
	sigTERM = syscall.SIGTERM
	sigKILL = syscall.SIGKILL
)

// forwarded are the signals dlock passes on to the command's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// foregroundPgrp returns the foreground process group of the terminal fd
// is, which is dlock's controlling terminal; ok is false when fd is not.
func foregroundPgrp(fd int) (pgrp int, ok bool) {
	var p int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&p)))
	return int(p), errno == 0
}

// isTerminal reports whether fd is dlock's controlling terminal.
func isTerminal(fd int) bool {
	_, ok := foregroundPgrp(fd)
	return ok
}

// terminalWidth returns the width of the terminal fd is, 0 if unknown.
func terminalWidth(fd int) int {
	var ws struct{ row, col, x, y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	if errno != 0 {
		return 0
	}
	return int(ws.col)
}

// setupChild makes cmd start in a process group of its own, which is
// signalled as a whole. When dlock runs in the foreground of its terminal,
// the group becomes the terminal's foreground group instead of dlock's, so
// that the command can read the terminal and gets its Ctrl-C directly
// (a background group reading it would be stopped). It reports whether it
// did that; restoreForeground then gives the terminal back.
func setupChild(cmd *exec.Cmd) (foreground bool) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if pg, ok := foregroundPgrp(0); ok && pg == syscall.Getpgrp() {
		attr.Foreground, attr.Ctty = true, 0
		foreground = true
	}
	setDeathSignal(attr)
	cmd.SysProcAttr = attr
	return foreground
}

// startedInForeground runs once the command started in the terminal's
// foreground: dlock, now in the background, ignores SIGTTOU so that its own
// messages on the terminal cannot stop it (with stty tostop), and so that it
// can take the terminal back. The command did not inherit the ignore.
func startedInForeground() { signal.Ignore(syscall.SIGTTOU) }

// restoreForeground makes dlock's process group the terminal's foreground
// group again, after the command exited.
func restoreForeground() {
	pgrp := int32(syscall.Getpgrp())
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, 0, uintptr(syscall.TIOCSPGRP), uintptr(unsafe.Pointer(&pgrp)))
}

// signalGroup sends sig to every process in the process group pgid.
func signalGroup(pgid int, sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return
	}
	_ = syscall.Kill(-pgid, s)
}

// waitGroupGone waits until no process is left in the group pgid or d has
// passed, and reports whether the group is gone.
func waitGroupGone(pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(min(20*time.Millisecond, time.Until(deadline)))
	}
}

// exitStatus returns the shell's status for a finished process: its exit
// code, or 128+N when signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// signalStatus is the status of a process that signal sig ended.
func signalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return exitError
}
