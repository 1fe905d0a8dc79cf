//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock-go/dlock"
)

// openPTY opens a pseudo-terminal 200 columns wide and returns its master
// and the path of its slave.
func openPTY(t *testing.T) (*os.File, string) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	ioctl := func(req uintptr, arg unsafe.Pointer) {
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), req, uintptr(arg)); errno != 0 {
			t.Fatalf("ioctl %#x on /dev/ptmx: %v", req, errno)
		}
	}
	var unlock int32
	ioctl(syscall.TIOCSPTLCK, unsafe.Pointer(&unlock))
	var n uint32
	ioctl(syscall.TIOCGPTN, unsafe.Pointer(&n))
	ws := struct{ row, col, x, y uint16 }{row: 24, col: 200}
	ioctl(syscall.TIOCSWINSZ, unsafe.Pointer(&ws))
	return m, fmt.Sprintf("/dev/pts/%d", n)
}

// On its terminal, dlock shows the wait as one line that it rewrites, and
// hands the terminal to the command, which can read it (a command left in
// a background process group would be stopped by SIGTTIN and never end).
func TestRunOnTerminal(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	m := h.client(dlock.WithClientName("tty-holder")).Mutex("tty")
	if err := m.Lock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	master, slavePath := openPTY(t)
	slave, err := os.OpenFile(slavePath, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(h.bin, "run", "tty", "--", "sh", "-c", `read line; echo "got:$line"; exit 3`)
	cmd.Env = append(cleanEnv(), "REDIS_URL="+h.url)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A session of its own, with the terminal as its controlling one: as
	// from a login shell, dlock runs in the terminal's foreground.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = slave.Close()
	exited := make(chan int, 1)
	go func() {
		_ = cmd.Wait()
		exited <- cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})

	var mu sync.Mutex
	var out bytes.Buffer
	go func() { // until every slave descriptor is closed (EIO)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	output := func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String()
	}

	// Three refreshes of the line at least (every 500ms), then the release.
	eventually(t, 15*time.Second, "the waiting line rewritten", func() bool {
		return strings.Count(output(), `waiting for "tty"`) >= 3
	})
	if err := m.Unlock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := master.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exited:
		if code != 3 {
			t.Fatalf("dlock exited %d, want the command's 3; terminal:\n%q", code, output())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("dlock still runs: its command could not read the terminal; terminal:\n%q", output())
	}
	eventually(t, 5*time.Second, "the command's output", func() bool { return strings.Contains(output(), "got:hello") })

	text := output()
	wait, _, _ := strings.Cut(text, "hello") // the echo of the input
	if strings.Contains(wait, "\n") || !strings.HasPrefix(wait, "\r") {
		t.Errorf("the wait was not one rewritten line:\n%q", wait)
	}
	if !strings.Contains(wait, "held by tty-holder (lease ") {
		t.Errorf("the waiting line does not show the holder and its lease:\n%q", wait)
	}
}
