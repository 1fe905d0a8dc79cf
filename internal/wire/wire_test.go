package wire

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
)

func TestRelease_EncodeRoundTrips(t *testing.T) {
	for _, m := range []Release{
		{From: "A", Wake: WakeOne},
		{From: "A", Wake: Wake{N: 0, Kind: KindWriter}},
		{From: "A", Wake: Wake{N: 0, IDs: []string{"X", "Y"}}},
		{From: "A", Wake: Wake{N: 1, Kind: KindHanded, IDs: []string{"T"}}},
		{From: "A", Wake: Wake{N: 1, Kind: KindHanded, IDs: []string{"T", "U"}, Fence: 1795443186107935, TTL: 2500 * time.Millisecond}},
		{From: "A", Wake: Wake{N: 1, Kind: KindReleased, IDs: []string{"H"}}},
	} {
		assert.Equal(t, m, DecodeRelease(m.Encode()), m.Encode())
	}
	assert.Equal(t, "A|1", Release{From: "A", Wake: WakeOne}.Encode(), "the short form scripts publish")
	m := DecodeRelease("garbage")
	assert.Equal(t, "garbage", m.From)
	assert.Equal(t, WakeOne, m.Wake, "a malformed message wakes one waiter")
}

func TestWaiters_RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		lease   time.Duration
		reserve int
		id      string
		want    string
	}{
		{0, 0, "c~X.abc", "0:c~X.abc"},
		{1500 * time.Millisecond, 0, "c~X.abc", "1500:c~X.abc"},
		{0, 4, "c~X.abc", "0+4:c~X.abc"},
		{time.Microsecond, 0, "w.r:x", "1:w.r:x"}, // a lease rounds up; an ID may hold ':'
	} {
		got := ExclWaiter(tc.lease, tc.reserve, tc.id)
		assert.Equal(t, tc.want, got)
		lease, reserve, id, ok := ParseExclWaiter(got)
		require.True(t, ok, got)
		assert.Equal(t, time.Duration(Millis(tc.lease))*time.Millisecond, lease)
		assert.Equal(t, tc.reserve, reserve)
		assert.Equal(t, tc.id, id)
	}
	for _, write := range []bool{false, true} {
		w, reserve := RWReader(2*time.Second, "c~X.o.me"), 0
		if write {
			w, reserve = RWWriter(2*time.Second, 4, "c~X.o.me"), 4
		}
		lease, gotReserve, gotWrite, id, ok := ParseRWWaiter(w)
		require.True(t, ok, w)
		assert.Equal(t, 2*time.Second, lease)
		assert.Equal(t, reserve, gotReserve)
		assert.Equal(t, write, gotWrite)
		assert.Equal(t, "c~X.o.me", id)
	}
	for _, bad := range []string{"", "x:1", "-1:a", "1+x:a", "no colon"} {
		_, _, _, ok := ParseExclWaiter(bad)
		assert.False(t, ok, bad)
	}
	_, _, _, _, ok := ParseRWWaiter("0:xowner")
	assert.False(t, ok, "a role other than r or w")
	_, _, _, _, ok = ParseRWWaiter("0+4:rowner")
	assert.False(t, ok, "a reader reserves no tokens")
}

func TestTry_DecodesEveryShape(t *testing.T) {
	got, err := DecodeTry("1795443186107935")
	require.NoError(t, err)
	assert.Equal(t, Try{Held: true, Count: 1, Token: 1795443186107935, Quiet: true}, got, "the bare token: the hot path, quiet")
	got, err = DecodeTry([]any{int64(1), int64(3), "42"})
	require.NoError(t, err)
	assert.Equal(t, Try{Held: true, Count: 3, Token: 42}, got)
	got, err = DecodeTry([]any{int64(1), int64(1), ""})
	require.NoError(t, err)
	assert.Equal(t, Try{Held: true, Count: 1}, got, "a read hold has no token")
	got, err = DecodeTry([]any{int64(0), int64(250), "c~X.h", "41", int64(1), "unset"})
	require.NoError(t, err)
	assert.Equal(t, Try{Left: 250 * time.Millisecond, Holder: "c~X.h", Token: 41, Queued: true, Unset: true}, got)
	for _, bad := range []any{int64(7), []any{int64(1)}, []any{int64(1), "x", "y"}, []any{int64(0), int64(1), ""}, "0"} {
		_, err := DecodeTry(bad)
		assert.Error(t, err, "%v", bad)
	}
}

func TestIDs_EscapeRoundTripsAndClientOf(t *testing.T) {
	for _, name := range []string{"web-1", "a.b,c|d~e%f g\x01", "ünï"} {
		id := NewClientID(name)
		assert.Equal(t, name, ClientNameOf(id+".hold"), "the name back from a hold ID")
		assert.Equal(t, id, ClientOf(id+".hold"))
		assert.Equal(t, name, UnescapeID(EscapeID(name)))
		// Every ID minted for a hold, an owner or a permit names its Client.
		owner := OwnerID(id, "order.42,x|y")
		for _, held := range []string{HoldID(id), owner, HandleOwnerID(id), PermitID(id)} {
			assert.Equal(t, id, ClientOf(held), held)
			assert.Equal(t, name, ClientNameOf(held), held)
		}
		assert.Equal(t, id+".o.order%2E42%2Cx%7Cy", owner, "an owner is escaped")
		assert.NotEqual(t, HoldID(id), HoldID(id))
		assert.Len(t, HoldID(id), len(id)+1+26, "128 random bits, as rand.Text spells them")
	}
}

// The Lua side of the formats reads what the Go side writes, and writes
// what the Go side reads: each lib.lua function run on a server, against
// its Go counterpart.
func TestLua_ReadsAndWritesTheSameFormats(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.NewClient(t)
	ctx := context.Background()
	run := func(body string, args ...any) any {
		t.Helper()
		v, err := redis.NewScript(scripts.Source("lib.lua")+"\n"+body).Run(ctx, rdb, nil, args...).Result()
		require.NoError(t, err, body)
		return v
	}

	w := ExclWaiter(1500*time.Millisecond, 4, "c~X.abc:d")
	assert.Equal(t, []any{int64(1500), "c~X.abc:d", int64(4)}, run("return {parse_waiter(ARGV[1])}", w))
	w = ExclWaiter(0, 0, "c~X.abc")
	assert.Equal(t, []any{int64(0), "c~X.abc", int64(0)}, run("return {parse_waiter(ARGV[1])}", w))
	w = RWWriter(0, 0, "c~X.o.me")
	assert.Equal(t, []any{int64(0), "w", "c~X.o.me", int64(0)}, run("return {parse_rw(ARGV[1])}", w))
	w = RWWriter(0, 4, "c~X.o.me")
	assert.Equal(t, []any{int64(0), "w", "c~X.o.me", int64(4)}, run("return {parse_rw(ARGV[1])}", w))
	w = RWReader(1500*time.Millisecond, "c~X.o.me")
	assert.Equal(t, []any{int64(1500), "r", "c~X.o.me", int64(0)}, run("return {parse_rw(ARGV[1])}", w))

	for _, tc := range []struct {
		lua  string
		args []any
		want Release
	}{
		{"return msg_wake(ARGV[1], 0, 'r')", []any{"A"}, Release{From: "A", Wake: Wake{Kind: KindReader}}},
		{"return msg_wake(ARGV[1], 1)", []any{"A"}, Release{From: "A", Wake: WakeOne}},
		{"return msg_ids(ARGV[1], {ARGV[2], ARGV[3]})", []any{"A", "X", "Y"}, Release{From: "A", Wake: Wake{IDs: []string{"X", "Y"}}}},
		{"return msg_handed(ARGV[1], ARGV[2], ARGV[3], 2500)", []any{"A", "T", "1795443186107935"},
			Release{From: "A", Wake: Wake{N: 1, Kind: KindHanded, IDs: []string{"T"}, Fence: 1795443186107935, TTL: 2500 * time.Millisecond}}},
		{"return msg_released(ARGV[1], ARGV[2])", []any{"A", "H"}, Release{From: "A", Wake: Wake{N: 1, Kind: KindReleased, IDs: []string{"H"}}}},
		{"return msg_released(ARGV[1], ARGV[2], ARGV[3])", []any{"A", "H", "1795443186107935"},
			Release{From: "A", Wake: Wake{N: 1, Kind: KindReleased, IDs: []string{"H"}, Fence: 1795443186107935}}},
	} {
		got, ok := run(tc.lua, tc.args...).(string)
		require.True(t, ok, tc.lua)
		assert.Equal(t, tc.want, DecodeRelease(got), tc.lua)
	}

	for _, tc := range []struct {
		lua  string
		want Try
	}{
		{"return held(2, '42')", Try{Held: true, Count: 2, Token: 42}},
		{"return held(1, '')", Try{Held: true, Count: 1}},
		{"return busy(250, 'H', '41', 1)", Try{Left: 250 * time.Millisecond, Holder: "H", Token: 41, Queued: true}},
		{"return busy(0, 'H', '', 0)", Try{Left: time.Millisecond, Holder: "H"}}, // a lease in its last millisecond
		{"return busy(-1, nil, nil, 0, 'unset')", Try{Unset: true}},              // no expiry: no lease left known
		{"return busy(nil, '', '', 0)", Try{}},
	} {
		got, err := DecodeTry(run(tc.lua))
		require.NoError(t, err, tc.lua)
		assert.Equal(t, tc.want, got, tc.lua)
	}
	spec := Spec{Kind: SpecMemberWith2, ID: "c~X.p.1"}
	assert.Equal(t, fmt.Sprintf("%c%s", SpecMemberWith2, "c~X.p.1"), spec.String())
	assert.Equal(t, 3, spec.Keys())
}
