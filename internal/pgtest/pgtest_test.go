//go:build unix

package pgtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/pgtest"
)

func TestStart_AcceptsQueriesOverTCPAndSocket_StopLeavesNoProcess(t *testing.T) {
	s := pgtest.Start(t)
	require.NotContains(t, s.DSN, ":5432/", "must not use the machine's own PostgreSQL")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", s.DSN)
	require.NoError(t, err)
	defer db.Close()
	var dir string
	require.NoError(t, db.QueryRowContext(ctx, "SHOW data_directory").Scan(&dir))
	assert.Equal(t, s.DataDir, dir, "data_directory")
	var fsync string
	require.NoError(t, db.QueryRowContext(ctx, "SHOW fsync").Scan(&fsync))
	assert.Equal(t, "off", fsync)

	_, port, _ := net.SplitHostPort(s.Addr)
	sock := filepath.Join(s.SocketDir, ".s.PGSQL."+port)
	_, err = os.Stat(sock)
	require.NoError(t, err, "unix socket")
	viaSocket, err := sql.Open("pgx", "host="+s.SocketDir+" port="+port+" user="+pgtest.Superuser+" dbname=postgres sslmode=disable")
	require.NoError(t, err)
	defer viaSocket.Close()
	var one int
	require.NoError(t, viaSocket.QueryRowContext(ctx, "SELECT 1").Scan(&one))
	assert.Equal(t, 1, one)

	var pid int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	pidFile, err := os.ReadFile(filepath.Join(s.DataDir, "postmaster.pid"))
	require.NoError(t, err)
	postmaster, err := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.NoError(t, viaSocket.Close())

	s.Stop()
	s.Stop() // twice is fine
	_, err = net.DialTimeout("tcp", s.Addr, time.Second)
	assert.Error(t, err, "port still accepting after Stop")
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "backend %d still alive after Stop", pid)
	assert.ErrorIs(t, syscall.Kill(postmaster, 0), syscall.ESRCH, "postmaster %d still alive after Stop", postmaster)
	assert.ErrorIs(t, syscall.Kill(-postmaster, 0), syscall.ESRCH, "process group %d not empty after Stop", postmaster)
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "socket left behind: %v", err)
}

// A test process that dies without Stop (a panic, a -timeout) must not leave
// its server running.
func TestStartProcess_TestProcessDies_ServerExits(t *testing.T) {
	if !pgtest.Available() {
		pgtest.Start(t) // skips or fails, as configured
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stderr: %s", stderr.String())
	require.Equal(t, 3, exit.ExitCode(), "stderr: %s", stderr.String())
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	require.NoError(t, err, "output %q", out)
	require.Eventually(t, func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH && syscall.Kill(-pid, 0) == syscall.ESRCH },
		15*time.Second, 20*time.Millisecond, "postgres %d outlived the test process", pid)
}

func TestShared_ReturnsOneServer(t *testing.T) {
	a, b := pgtest.Shared(t), pgtest.Shared(t)
	require.Same(t, a, b)
}

// crashEnv makes the test binary a process that starts a server, prints
// its postmaster's pid, and exits without stopping it.
const crashEnv = "PGTEST_CRASH_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashEnv); dir != "" {
		s, err := pgtest.StartProcess(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		b, err := os.ReadFile(filepath.Join(s.DataDir, "postmaster.pid"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(strings.SplitN(string(b), "\n", 2)[0])
		os.Exit(3) // as a panic or -timeout would: no Stop
	}
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}
