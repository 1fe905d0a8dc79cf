package torture

import (
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/torture/check"
	"github.com/dlock-go/dlock/internal/torture/history"
)

func TestMain(m *testing.M) {
	if IsWorker() { // the test binary runs again as each worker
		os.Exit(WorkerMain())
	}
	os.Exit(m.Run())
}

func needRedis(t *testing.T) {
	t.Helper()
	if !redistest.Available() {
		if os.Getenv(redistest.RequireEnv) == "1" {
			t.Fatalf("redis-server not on PATH and %s=1", redistest.RequireEnv)
		}
		t.Skip("needs redis-server on PATH")
	}
}

// The suite must catch a client that is never told its hold was lost: with
// its connections partitioned past the lease, such a holder goes on
// holding, and the next holder's grant overlaps its hold. Whether a
// partition hits a holder is up to the schedule and the machine's timing:
// the deaf workers hold for two to four leases, two workers share one
// name, and a schedule that happens to catch nothing is followed by a
// second one; both checkers must catch the deaf holders in one run.
func TestTorture_HolderNeverToldOfLoss_Caught(t *testing.T) {
	needRedis(t)
	var missed []string
	for _, seed := range []int64{7, 8} {
		cfg := DefaultConfig()
		cfg.Duration, cfg.Quiet, cfg.Seed = 12*time.Second, time.Second, seed
		cfg.Workers, cfg.Goroutines, cfg.Names = 2, 3, 1
		cfg.Lease = 500 * time.Millisecond
		cfg.Prims = []string{history.MutexNoCohort}
		cfg.Faults = []string{FaultPartition}
		cfg.OutDir = t.TempDir()
		cfg.BreakLost = true
		res, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res.Report.String())
		missed = missed[:0]
		for _, name := range []string{check.LostBeforeAcquired, check.Linearizability} {
			if r := res.Report.Result(name); r == nil || len(r.Violations) == 0 {
				missed = append(missed, name)
			}
		}
		if len(missed) == 0 {
			return
		}
		t.Logf("seed %d: %v found nothing; one more schedule", seed, missed)
	}
	t.Errorf("%v found nothing in two runs whose holders were never told of their loss", missed)
}
