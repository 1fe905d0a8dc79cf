//go:build race

package main

// raceEnabled: the tests build the dlock binary with -race too.
const raceEnabled = true
