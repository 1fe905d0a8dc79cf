package main

import (
	"runtime"
	"syscall"
)

// setDeathSignal has the kernel kill the command if dlock dies without
// being able to stop it (SIGKILL, the OOM killer), since nobody would renew
// its lock any more. Only the command itself gets the signal, not the rest
// of its group. The kernel sends it when the thread that started the
// command exits, so the thread is locked to the calling goroutine, which
// stays on it until dlock exits.
func setDeathSignal(attr *syscall.SysProcAttr) {
	runtime.LockOSThread()
	attr.Pdeathsig = syscall.SIGKILL
}
