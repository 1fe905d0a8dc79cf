package lease

import (
	"log/slog"
	"sync/atomic"

	"github.com/dlock-go/dlock/internal/errs"
)

// Outage logs, once, that Redis could not be reached, and once that it
// answers again, however many calls and renewals meet the outage between.
type Outage struct {
	Log  *slog.Logger
	down atomic.Bool
}

// Saw records the outcome of a call to Redis: err nil or a reply from
// Redis is an answer; an error that says Redis could not be reached is the
// outage.
func (o *Outage) Saw(err error) {
	switch {
	case err == nil || errs.IsReply(err):
		if o.down.Load() && o.down.CompareAndSwap(true, false) {
			o.Log.Info("dlock: Redis answers again")
		}
	case errs.IsUnavailable(err):
		if o.down.CompareAndSwap(false, true) {
			o.Log.Warn("dlock: Redis could not be reached; calls fail with ErrUnavailable, and holds are lost at their deadlines, until it answers again",
				"error", err.Error())
		}
	}
}
