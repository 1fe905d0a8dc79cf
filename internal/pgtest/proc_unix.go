//go:build unix

package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// credential is the OS user initdb and postgres run as; nil means the
// current one.
type credential = syscall.Credential

// runAs returns nil when the current user may run postgres, or, as root,
// the "postgres" OS user.
func runAs() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, which postgres refuses, and no \"postgres\" OS user to run it as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres OS user: %w", err)
	}
	return &credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// handOver makes dirs usable by cred's user: it owns them, and may traverse
// every directory above them (a test's temporary directory is 0700, owned by
// the test's user). Only search permission is added above: nothing there
// becomes readable or writable.
func handOver(cred *credential, dirs ...string) error {
	if cred == nil {
		return nil
	}
	for _, dir := range dirs {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
		for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if fi.Mode().Perm()&0o001 == 0 {
				if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
					return err
				}
			}
			if p == filepath.Dir(p) {
				break
			}
		}
	}
	return nil
}

// sysProcAttr runs a child as cred (when not nil) in a process group of its
// own, which killGroup ends, and, where the OS can, has it sent sig if the
// test process dies first (a panic, a -timeout), so that a crashed test
// leaves no server behind. SIGQUIT makes postgres shut down at once, taking
// its children with it.
func sysProcAttr(cred *credential, sig syscall.Signal) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	setDeathSignal(attr, sig)
	return attr
}

// killGroup kills whatever is left of the process group led by pid.
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }
