// Command tracing shows the OpenTelemetry spans dlock records for a
// contended run: a holder keeps a lock for 100ms while a request on another
// Client blocks on it, then both release. Each span is printed as one line
// (name, parent, duration, attributes, events), and the full spans as JSON
// by the stdout exporter with -json.
//
//	go run ./examples/tracing                                  # embedded Redis
//	go run ./examples/tracing -redis redis://127.0.0.1:6379/0  # a real server
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/embedded"
)

func main() {
	url := flag.String("redis", os.Getenv("REDIS_URL"), "Redis URL; empty runs an embedded Redis (miniredis)")
	asJSON := flag.Bool("json", false, "also print every span as JSON (the stdout exporter)")
	flag.Parse()
	if err := run(*url, *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
}

func run(url string, asJSON bool) error {
	opts := &redis.Options{}
	if url == "" {
		mr, err := embedded.Start("") // a miniredis whose TTLs run out in real time
		if err != nil {
			return err
		}
		defer mr.Close()
		opts.Addr = mr.Addr()
	} else {
		var err error
		if opts, err = redis.ParseURL(url); err != nil {
			return err
		}
	}

	// The usual OpenTelemetry setup: a global TracerProvider. dlock picks it
	// up with no option of its own.
	var out io.Writer = io.Discard
	if asJSON {
		out = os.Stdout
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(out), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	defer tp.Shutdown(context.Background())

	ctx := context.Background()
	holderRDB, requestRDB := redis.NewClient(opts), redis.NewClient(opts)
	defer holderRDB.Close()
	defer requestRDB.Close()
	holder, service := dlock.New(holderRDB), dlock.New(requestRDB)
	defer holder.Close()
	defer service.Close()

	tracer := otel.Tracer("example")
	hctx, hspan := tracer.Start(ctx, "nightly-job")
	h := holder.Mutex("orders:42")
	if err := h.Lock(hctx); err != nil {
		return err
	}
	released := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		released <- h.Unlock(hctx)
	}()

	rctx, rspan := tracer.Start(ctx, "POST /orders/42")
	m := service.Mutex("orders:42")
	if err := m.Lock(rctx); err != nil { // blocks until the job releases
		return err
	}
	if err := m.Unlock(rctx); err != nil {
		return err
	}
	rspan.End()
	if err := <-released; err != nil {
		return err
	}
	hspan.End()

	names := map[string]string{}
	for _, s := range rec.Ended() {
		names[s.SpanContext().SpanID().String()] = s.Name()
	}
	fmt.Println("spans of a contended run, in the order they ended:")
	for _, s := range rec.Ended() {
		parent := names[s.Parent().SpanID().String()]
		if parent == "" {
			parent = "-"
		}
		var attrs []string
		for _, kv := range s.Attributes() {
			attrs = append(attrs, fmt.Sprintf("%s=%s", kv.Key, kv.Value.String()))
		}
		fmt.Printf("%-24s parent=%-18s %8v  %s\n", s.Name(), parent,
			s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond), strings.Join(attrs, " "))
		for _, ev := range s.Events() {
			var kv []string
			for _, a := range ev.Attributes {
				kv = append(kv, fmt.Sprintf("%s=%s", a.Key, a.Value.String()))
			}
			fmt.Printf("%24s  event %s +%v %s\n", "", ev.Name, ev.Time.Sub(s.StartTime()).Round(10*time.Microsecond), strings.Join(kv, " "))
		}
	}
	return nil
}
