package pgtest

import "syscall"

// setDeathSignal has the child sent sig when the thread that started it
// exits. Go's runtime ends a thread only when a goroutine locked to it
// exits, which pgtest's callers do not do, so in effect: when the test
// process dies.
func setDeathSignal(attr *syscall.SysProcAttr, sig syscall.Signal) { attr.Pdeathsig = sig }
