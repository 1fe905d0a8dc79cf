//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// intervalEnv makes dlock's command, the test binary, log its interval.
func intervalEnv() []string { return []string{childEnv + "=interval"} }

func testBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// Runs of dlock on one name hold it one after another: the intervals
// their commands log never overlap, and each waited for the one before,
// saying so once on standard error. So that they all contend, the test
// holds the lock until all are queued.
func TestRunExcludes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const runs, hold = 3, 400 * time.Millisecond
	log := h.file("intervals")
	exe := testBinary(t)
	gate := h.client().Mutex("excl")
	if err := gate.Lock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var procs []*proc
	for range runs {
		procs = append(procs, h.start(intervalEnv(), "run", "excl", "--", exe, log, hold.String()))
	}
	eventually(t, 15*time.Second, "all runs queued", func() bool { return getStatus(t, h, "excl").Waiting == runs })
	began := time.Now()
	if err := gate.Unlock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waited := 0
	for _, p := range procs {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("dlock exited %d; stderr:\n%s", code, p.stderr())
		}
		n := strings.Count(p.stderr(), `waiting for "excl"`)
		if n > 1 {
			t.Errorf("the waiting line was printed %d times off a terminal, want once:\n%s", n, p.stderr())
		}
		waited += n
	}
	ivs := readIntervals(t, log)
	if len(ivs) != runs {
		t.Fatalf("%d intervals logged, want %d", len(ivs), runs)
	}
	sort.Slice(ivs, func(i, j int) bool { return ivs[i].start < ivs[j].start })
	for i := 1; i < len(ivs); i++ {
		if ivs[i].start < ivs[i-1].end {
			t.Errorf("run %d started %v before run %d ended", i, time.Duration(ivs[i-1].end-ivs[i].start), i-1)
		}
		if ivs[i].token <= ivs[i-1].token {
			t.Errorf("tokens not increasing in the order of the holds: %d then %d", ivs[i-1].token, ivs[i].token)
		}
	}
	if waited != runs {
		t.Errorf("%d runs said they waited, want %d", waited, runs)
	}
	if span := time.Since(began); span < runs*hold {
		t.Errorf("all runs done in %v, less than %d holds of %v", span, runs, hold)
	}
	for _, iv := range ivs {
		if iv.name != "excl" {
			t.Errorf("DLOCK_NAME = %q, want excl", iv.name)
		}
	}
}

// The command's exit status is dlock's; dlock's own statuses are those the
// interface fixes.
func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, tc := range []struct {
		argv []string
		want int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 7"}, 7},
		{[]string{"sh", "-c", "exit 1"}, 1},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
		{[]string{"./no-such-command"}, 127},
	} {
		code, _, stderr := h.run(append([]string{"run", "status", "--"}, tc.argv...)...)
		if code != tc.want {
			t.Errorf("%q: exit %d, want %d; stderr:\n%s", tc.argv, code, tc.want, stderr)
		}
	}
	// Each run released the lock at its end: the name is free at once,
	// though the lease of the last hold (30s) would run long.
	ok, err := h.client().Mutex("status").TryLock(ctxFor(t, 5*time.Second))
	if err != nil || !ok {
		t.Fatalf("TryLock after the runs: %v, %v", ok, err)
	}
}

// A lock held elsewhere makes --no-wait, and --timeout once it passes, exit
// 75 without running the command, naming the holder; once it is free the
// same run goes through.
func TestRunBusy(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	c := h.client(dlock.WithClientName("holder-in-test"))
	m := c.Mutex("busy")
	if err := m.Lock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	marker := h.file("ran")
	touch := []string{"sh", "-c", `echo ran >> "$0"`, marker}

	code, _, stderr := h.run(append([]string{"run", "--no-wait", "busy", "--"}, touch...)...)
	if code != 75 {
		t.Errorf("--no-wait on a held lock: exit %d, want %d; stderr:\n%s", code, 75, stderr)
	}
	if !strings.Contains(stderr, "holder-in-test") {
		t.Errorf("--no-wait does not name the holder:\n%s", stderr)
	}

	start := time.Now()
	code, _, stderr = h.run(append([]string{"run", "--timeout", "400ms", "busy", "--"}, touch...)...)
	took := time.Since(start)
	if code != 75 {
		t.Errorf("--timeout on a held lock: exit %d, want %d; stderr:\n%s", code, 75, stderr)
	}
	if took < 400*time.Millisecond {
		t.Errorf("--timeout 400ms gave up after %v", took)
	}
	if !strings.Contains(stderr, `waiting for "busy": held by holder-in-test (lease `) {
		t.Errorf("the wait does not show the holder and its lease:\n%s", stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the command ran although the lock was busy: %q", readFile(t, marker))
	}

	// A wait within --timeout that the holder ends.
	p := h.start(nil, append([]string{"run", "--timeout", "20s", "busy", "--"}, touch...)...)
	eventually(t, 10*time.Second, "the waiting line", func() bool { return strings.Contains(p.stderr(), "waiting for") })
	if err := m.Unlock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("run after Unlock: exit %d; stderr:\n%s", code, p.stderr())
	}
	code, _, stderr = h.run(append([]string{"run", "--no-wait", "busy", "--"}, touch...)...)
	if code != 0 {
		t.Fatalf("--no-wait on a free lock: exit %d; stderr:\n%s", code, stderr)
	}
	if got := readFile(t, marker); got != "ran\nran\n" {
		t.Fatalf("the command ran %q, want twice", got)
	}
}

// A Redis nobody answers on is exit 69 for every command, and the command
// does not run; --redis wins over $REDIS_URL.
func TestUnreachableRedis(t *testing.T) {
	t.Parallel()
	h := &harness{t: t, url: "redis://" + closedAddr(t) + "/0", dir: t.TempDir(), bin: dlockBin(t)}
	marker := h.file("ran")
	var procs []*proc
	for _, args := range [][]string{
		{"run", "x", "--", "sh", "-c", `echo ran > "$0"`, marker},
		{"run", "--redis", "redis://" + closedAddr(t), "x", "--", "sh", "-c", `echo ran > "$0"`, marker},
		{"status", "x"},
		{"list"},
		{"unlock", "--force", "x"},
	} {
		procs = append(procs, h.start(nil, args...)) // each takes go-redis's retries, ~2s
	}
	for _, p := range procs {
		code, stderr, args := p.wait(30*time.Second), p.stderr(), p.cmd.Args[1:]
		if code != 69 {
			t.Errorf("%q: exit %d, want %d; stderr:\n%s", args, code, 69, stderr)
		}
		if !strings.Contains(stderr, "connection refused") {
			t.Errorf("%q: stderr does not say why:\n%s", args, stderr)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran without Redis")
	}
}

// --redis is used over a $REDIS_URL that points nowhere.
func TestRedisFlagWins(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	good := h.url
	h.url = "redis://" + closedAddr(t) + "/0"
	code, stdout, stderr := h.run("run", "--redis", good, "flagwins", "--", "sh", "-c", `echo "$DLOCK_NAME"`)
	if code != 0 || stdout != "flagwins\n" {
		t.Fatalf("exit %d, stdout %q; stderr:\n%s", code, stdout, stderr)
	}
}

// DLOCK_NAME is the name and DLOCK_TOKEN a fencing token that strictly
// increases from run to run, also across a hold by another Client, and is
// the token status reports.
func TestRunToken(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	c := h.client()
	var tokens []uint64
	for i := range 5 {
		if i == 2 { // a hold of the library in between
			m := c.Mutex("tok")
			if err := m.Lock(ctxFor(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, m.Token())
			if err := m.Unlock(ctxFor(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		code, stdout, stderr := h.run("run", "tok", "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_TOKEN"`)
		if code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr)
		}
		name, tok, ok := strings.Cut(strings.TrimSpace(stdout), " ")
		if !ok || name != "tok" {
			t.Fatalf("the command saw DLOCK_NAME and DLOCK_TOKEN as %q", stdout)
		}
		n, err := strconv.ParseUint(tok, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("DLOCK_TOKEN %q is not a positive integer", tok)
		}
		tokens = append(tokens, n)
	}
	t.Logf("tokens: %v", tokens)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens do not strictly increase: %v", tokens)
		}
	}
	// Released, the lock is no longer shown by status (exit 1); its token
	// memory still answers a handle's Status.
	if code, _, _ := h.run("status", "tok"); code != 1 {
		t.Fatalf("status of the released lock: exit %d, want 1", code)
	}
	st, err := h.client().Mutex("tok").Status(ctxFor(t, 5*time.Second))
	if err != nil || st.Token != tokens[len(tokens)-1] {
		t.Fatalf("status token %d (%v), want the last run's %d", st.Token, err, tokens[len(tokens)-1])
	}
}

// trapScript sets a trap on TERM that appends "TERM" to the file $2, and
// then $3 ("exit" to exit 0, anything else to carry on), signals it is
// ready in $1, and loops.
const trapScript = `trap 'echo TERM >> "$2"; [ "$3" = exit ] && exit 0' TERM
` + readyScript + `
while :; do sleep 0.05; done`

// unlock --force while dlock runs: dlock learns of the loss at its next
// renewal, sends the command's group SIGTERM, and exits 70 saying why. A
// command that exits on SIGTERM ends it at once; one that carries on gets
// SIGKILL after --grace.
func TestForceUnlockStopsCommand(t *testing.T) {
	t.Parallel()
	t.Run("exits on TERM", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		ready, marker := h.file("ready"), h.file("term")
		p := h.start(nil, "run", "--ttl", "900ms", "lost1", "--", "sh", "-c", trapScript, "sh", ready, marker, "exit")
		pid := waitReady(t, p, ready)
		// A waiter, which unlock --force must wake.
		waiter := h.start(nil, "run", "lost1", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		eventually(t, 10*time.Second, "the waiter queued", func() bool { return getStatus(t, h, "lost1").Waiting == 1 })
		unlocking := time.Now()
		code, stdout, stderr := h.run("unlock", "--force", "lost1")
		if code != 0 {
			t.Fatalf("unlock --force: exit %d; stderr:\n%s", code, stderr)
		}
		want := `released "lost1", held by ` + defaultName(t, p.cmd.Process.Pid) + "; the first of 1 waiting gets it"
		if !strings.Contains(stdout, want) {
			t.Errorf("unlock --force said %q, want %q", stdout, want)
		}
		if code := waiter.wait(10 * time.Second); code != 0 || waiter.stdout() == "" {
			t.Fatalf("the waiter: exit %d, stdout %q; stderr:\n%s", code, waiter.stdout(), waiter.stderr())
		}
		t.Logf("the waiter ran %v after unlock --force started", waiter.ended.Sub(unlocking))
		if code := p.wait(10 * time.Second); code != 70 {
			t.Fatalf("dlock exited %d, want %d; stderr:\n%s", code, 70, p.stderr())
		}
		took := p.ended.Sub(unlocking)
		t.Logf("dlock exited %v after unlock --force started", took)
		if took > 5*time.Second { // far below the default --grace of 10s
			t.Errorf("dlock took %v to stop a command that exits on SIGTERM", took)
		}
		if got := readFile(t, marker); got != "TERM\n" {
			t.Errorf("the command's trap logged %q, want one TERM", got)
		}
		if e := p.stderr(); !strings.Contains(e, `lost the lock "lost1" while the command ran`) || !strings.Contains(e, "SIGTERM") {
			t.Errorf("dlock does not say why it exits:\n%s", e)
		}
		if !processGone(pid) {
			t.Errorf("the command (pid %d) still runs", pid)
		}
	})
	t.Run("ignores TERM", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		const grace = 800 * time.Millisecond
		ready, marker := h.file("ready"), h.file("term")
		p := h.start(nil, "run", "--ttl", "900ms", "--grace", grace.String(), "lost2", "--",
			"sh", "-c", trapScript, "sh", ready, marker, "stay")
		pid := waitReady(t, p, ready)
		if code, _, stderr := h.run("unlock", "--force", "lost2"); code != 0 {
			t.Fatalf("unlock --force: exit %d; stderr:\n%s", code, stderr)
		}
		if code := p.wait(10 * time.Second); code != 70 {
			t.Fatalf("dlock exited %d, want %d; stderr:\n%s", code, 70, p.stderr())
		}
		// The trap's write stamped the marker when SIGTERM came.
		fi, err := os.Stat(marker)
		if err != nil {
			t.Fatalf("the command never got SIGTERM: %v", err)
		}
		termed := fi.ModTime()
		gap := p.ended.Sub(termed)
		t.Logf("dlock exited %v after the command logged SIGTERM (--grace %v)", gap, grace)
		// The trap ran a little after SIGTERM was sent, so the gap may be a
		// little under the grace; a SIGKILL with the SIGTERM would make it
		// about 0, one that never came would fail the wait.
		if gap < grace/2 || gap > grace+3*time.Second {
			t.Errorf("SIGKILL came %v after SIGTERM, want about %v", gap, grace)
		}
		e := p.stderr()
		for _, want := range []string{`lost the lock "lost2"`, "sending SIGKILL", "command status 137"} {
			if !strings.Contains(e, want) {
				t.Errorf("stderr lacks %q:\n%s", want, e)
			}
		}
		if !processGone(pid) {
			t.Errorf("the command (pid %d) still runs", pid)
		}
	})
}

// SIGTERM, SIGINT and SIGHUP sent to dlock reach its command; dlock exits
// with the command's status and releases the lock then, not when its lease
// (the default 30s) runs out.
func TestSignalsForwarded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		sigName := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP"}[sig]
		t.Run(sigName, func(t *testing.T) {
			t.Parallel()
			if signal.Ignored(sig) {
				// dlock inherits that, and rightly leaves it ignored.
				t.Skipf("the test runs with SIG%s ignored", sigName)
			}
			h := h.with(t)
			name := "sig-" + sigName
			ready, marker := h.file(name+".ready"), h.file(name+".got")
			exitCode := 5 + i // the command's own, told apart per signal
			var script strings.Builder
			for _, s := range []string{"TERM", "INT", "HUP"} {
				fmt.Fprintf(&script, "trap 'echo %s > \"$2\"; exit %d' %s\n", s, exitCode, s)
			}
			script.WriteString(readyScript + "\nwhile :; do sleep 0.05; done")
			p := h.start(nil, "run", name, "--", "sh", "-c", script.String(), "sh", ready, marker)
			waitReady(t, p, ready)
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(10 * time.Second); code != exitCode {
				t.Fatalf("dlock exited %d, want the command's %d; stderr:\n%s", code, exitCode, p.stderr())
			}
			if got := strings.TrimSpace(readFile(t, marker)); got != sigName {
				t.Fatalf("the command got %q, want %s", got, sigName)
			}
			if code, stdout, _ := h.run("status", name); code != 1 {
				t.Fatalf("still held after dlock exited: exit %d:\n%s", code, stdout)
			}
			ok, err := h.client().Mutex(name).TryLock(ctxFor(t, 5*time.Second))
			if err != nil || !ok {
				t.Fatalf("TryLock after dlock exited: %v, %v", ok, err)
			}
		})
	}
}

// A signal dlock was started with ignored, as under nohup, stays ignored,
// for dlock and for its command, which a hangup must not end.
func TestIgnoredSignalStaysIgnored(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ready, marker := h.file("ready"), h.file("got")
	// sh cannot trap a signal ignored when it started: the trap only
	// works if dlock handed the command SIGHUP at its default.
	script := `trap 'echo HUP > "$2"; exit 9' HUP
` + readyScript + `
while :; do sleep 0.05; done`
	p := h.startArgv(nil, []string{"sh", "-c", `trap "" HUP; exec "$@"`, "sh",
		h.bin, "run", "nohup", "--", "sh", "-c", script, "sh", ready, marker})
	pid := waitReady(t, p, ready)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil { // dlock: exec kept the pid
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case <-p.done:
		t.Fatalf("dlock exited %d on a SIGHUP it was started ignoring; stderr:\n%s", p.code, p.stderr())
	default:
	}
	if got := readFile(t, marker); got != "" || processGone(pid) {
		t.Fatalf("the command ended on SIGHUP (trap logged %q)", got)
	}
	// SIGTERM is not ignored: it reaches the command, which has no trap
	// for it.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(10 * time.Second); code != 128+15 {
		t.Fatalf("dlock exited %d after SIGTERM, want 143; stderr:\n%s", code, p.stderr())
	}
}

// The JSON shapes of status and list, as a script outside reads them.
type statusOut struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Token   uint64 `json:"token"`
	Waiting int    `json:"waiting"`
	Holders []struct {
		ID      string `json:"id"`
		Client  string `json:"client"`
		LeaseMS int64  `json:"lease_ms"`
		Count   int    `json:"count"`
	} `json:"holders"`
	Total *int `json:"total"`
	Free  *int `json:"free"`
}

func getStatus(t *testing.T, h *harness, name string) statusOut {
	t.Helper()
	code, stdout, stderr := h.run("status", "--json", name)
	if code != 0 {
		t.Fatalf("status --json %s: exit %d; stderr:\n%s", name, code, stderr)
	}
	var st statusOut
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json %s: %v in %q", name, err, stdout)
	}
	return st
}

// status and list, in text and JSON, name the holder (the dlock process's
// Client, host:pid), its token and lease, and the queue; names that hold
// nothing fail.
func TestStatusAndList(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	tokFile, release := h.file("token"), h.file("release")
	holder := h.start(nil, "run", "--ttl", "6s", "insp-a", "--", "sh", "-c",
		`echo "$DLOCK_TOKEN" > "$0.tmp" && mv "$0.tmp" "$0"; while [ ! -e "$1" ]; do sleep 0.02; done`, tokFile, release)
	eventually(t, 15*time.Second, "the holder's command", func() bool { return readFile(t, tokFile) != "" })
	token, err := strconv.ParseUint(strings.TrimSpace(readFile(t, tokFile)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	waiter := h.start(nil, "run", "insp-a", "--", "true")
	holderName := defaultName(t, holder.cmd.Process.Pid)

	// Another name, held by the library, and one that must not match.
	other := h.client(dlock.WithClientName("tester"))
	if err := other.Mutex("insp-b").Lock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := other.Mutex("zzz-unrelated").Lock(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	var st statusOut
	eventually(t, 10*time.Second, "status showing the waiter", func() bool {
		st = getStatus(t, h, "insp-a")
		return st.Waiting == 1
	})
	if st.Name != "insp-a" || st.Kind != "mutex" || st.Token != token || len(st.Holders) != 1 {
		t.Fatalf("status --json = %+v, want mutex insp-a held once with token %d", st, token)
	}
	if hd := st.Holders[0]; hd.Client != holderName || hd.LeaseMS <= 0 || hd.LeaseMS > 6000 || hd.Count != 1 ||
		!strings.HasPrefix(hd.ID, holderName+"~") {
		t.Fatalf("holder %+v, want client %s with a lease in (0, 6s]", hd, holderName)
	}

	code, stdout, stderr := h.run("status", "insp-a")
	if code != 0 {
		t.Fatalf("status: exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"kind:", "mutex", "holder:", holderName, strconv.FormatUint(token, 10), "waiting:  1"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, stdout)
		}
	}

	code, stdout, stderr = h.run("list", "--json", "insp-*")
	if code != 0 {
		t.Fatalf("list --json: exit %d; stderr:\n%s", code, stderr)
	}
	var all []statusOut
	if err := json.Unmarshal([]byte(stdout), &all); err != nil {
		t.Fatalf("list --json: %v in %q", err, stdout)
	}
	var names, clients []string
	for _, s := range all {
		names = append(names, s.Name)
		if len(s.Holders) != 1 {
			t.Fatalf("list: %s has holders %+v", s.Name, s.Holders)
		}
		clients = append(clients, s.Holders[0].Client)
	}
	if !slices.Equal(names, []string{"insp-a", "insp-b"}) || !slices.Equal(clients, []string{holderName, "tester"}) {
		t.Fatalf("list --json insp-* gave names %q held by %q", names, clients)
	}
	if all[0].Token != token || all[0].Waiting != 1 {
		t.Fatalf("list: %+v, want token %d and one waiting", all[0], token)
	}

	code, stdout, _ = h.run("list")
	if code != 0 || !strings.Contains(stdout, "zzz-unrelated") || !strings.Contains(stdout, holderName) {
		t.Fatalf("list: exit %d:\n%s", code, stdout)
	}

	// Names that hold nothing.
	if code, _, stderr := h.run("status", "--json", "insp-none"); code != 1 || !strings.Contains(stderr, `"insp-none"`) {
		t.Errorf("status of a missing name: exit %d, stderr %q", code, stderr)
	}
	if code, stdout, stderr := h.run("list", "--json", "none-*"); code != 1 || strings.TrimSpace(stdout) != "[]" || stderr == "" {
		t.Errorf("list matching nothing: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := h.run("unlock", "--force", "insp-none"); code != 1 || !strings.Contains(stderr, `"insp-none"`) {
		t.Errorf("unlock of a missing name: exit %d, stderr %q", code, stderr)
	}

	// The holder ends; the waiter gets the lock and runs.
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := holder.wait(10 * time.Second); code != 0 {
		t.Fatalf("holder: exit %d; stderr:\n%s", code, holder.stderr())
	}
	if code := waiter.wait(10 * time.Second); code != 0 {
		t.Fatalf("waiter: exit %d; stderr:\n%s", code, waiter.stderr())
	}
	// Released, the lock keeps nothing that status or unlock reports: both
	// say so (exit 1), as for a name never used, and the library still
	// knows its last token.
	if code, _, stderr := h.run("status", "--json", "insp-a"); code != 1 || !strings.Contains(stderr, `"insp-a"`) {
		t.Errorf("status of a released lock: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := h.run("unlock", "--force", "insp-a"); code != 1 || !strings.Contains(stderr, `"insp-a"`) {
		t.Errorf("unlock of a released lock: exit %d, stderr %q", code, stderr)
	}
	last, err := h.client().Mutex("insp-a").Status(ctxFor(t, 5*time.Second))
	if err != nil || last.Held() || last.Waiting != 0 || last.Token <= token {
		t.Fatalf("after both runs: %+v, %v", last, err)
	}
}

// --permits N: at most N runs hold the semaphore at once, and N do.
func TestRunPermits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const runs, permits, hold = 5, 2, 500 * time.Millisecond
	log := h.file("intervals")
	exe := testBinary(t)
	// The test holds every permit until all runs are queued, so that they
	// all contend.
	sem := h.client().Semaphore("sem", dlock.WithIdleExpiry(time.Hour))
	if _, err := sem.TrySetPermits(ctxFor(t, 5*time.Second), permits); err != nil {
		t.Fatal(err)
	}
	gate, err := sem.Acquire(ctxFor(t, 5*time.Second), permits)
	if err != nil {
		t.Fatal(err)
	}
	var procs []*proc
	for range runs {
		procs = append(procs, h.start(intervalEnv(), "run", "--permits", strconv.Itoa(permits), "sem", "--", exe, log, hold.String()))
	}
	eventually(t, 15*time.Second, "all runs queued", func() bool { return getStatus(t, h, "sem").Waiting == runs })
	if err := gate.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// While they run, a run that wants another total is refused.
	eventually(t, 15*time.Second, "a first permit", func() bool { return readFile(t, log) != "" })
	code, _, stderr := h.run("run", "--permits", "3", "sem", "--", "true")
	if code != 1 || !strings.Contains(stderr, "has 2 permits, not 3") {
		t.Errorf("--permits 3 on a semaphore of 2: exit %d; stderr:\n%s", code, stderr)
	}
	for _, p := range procs {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("dlock exited %d; stderr:\n%s", code, p.stderr())
		}
	}
	ivs := readIntervals(t, log)
	if len(ivs) != runs {
		t.Fatalf("%d intervals logged, want %d", len(ivs), runs)
	}
	most := maxOverlap(ivs)
	t.Logf("at most %d of %d runs held a permit at once", most, runs)
	if most > permits {
		t.Fatalf("%d runs held a permit at once, with %d permits", most, permits)
	}
	if most < permits {
		t.Fatalf("never more than %d run at once, with %d permits: it acts as a lock", most, permits)
	}
	st := getStatus(t, h, "sem")
	if st.Kind != "semaphore" || st.Total == nil || *st.Total != permits || st.Free == nil || *st.Free != permits {
		t.Fatalf("status after the runs: %+v", st)
	}
}
