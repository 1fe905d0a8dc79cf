package main

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

func init() {
	// go-redis logs dial failures and Sentinel events on standard error by
	// itself; dlock reports what matters in its own words.
	redis.SetLogger(quietRedis{})
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// newLogger returns the logger the library warns through (renewal
// failures, pub/sub reconnects): one line each on w, without time and
// level. Lost holds are left out: run reports them itself.
func newLogger(w io.Writer) *slog.Logger {
	h := slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
				return slog.Attr{}
			}
			return a
		},
	})
	return slog.New(skipLost{h})
}

// skipLost drops the library's "hold lost" records.
type skipLost struct{ slog.Handler }

func (h skipLost) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "dlock: hold lost" {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h skipLost) WithAttrs(as []slog.Attr) slog.Handler { return skipLost{h.Handler.WithAttrs(as)} }
func (h skipLost) WithGroup(g string) slog.Handler       { return skipLost{h.Handler.WithGroup(g)} }

// reason is err's text without the library's "dlock: " prefixes, for
// messages that already start with dlock's name.
func reason(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "dlock: ")
	return strings.TrimPrefix(s, "lock lost: ")
}
