//go:build !unix

package pgtest

import "syscall"

type credential struct{}

func runAs() (*credential, error) { return nil, nil }

func handOver(*credential, ...string) error { return nil }

func sysProcAttr(*credential, syscall.Signal) *syscall.SysProcAttr { return nil }

func killGroup(int) {}
