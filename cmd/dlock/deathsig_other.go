//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package main

import "syscall"

// setDeathSignal does nothing: only Linux can kill a child when its parent
// dies.
func setDeathSignal(*syscall.SysProcAttr) {}
