package scripts

import (
	"io/fs"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
)

// Every script, with its includes resolved, must compile, and every include
// must name a file that exists: a broken one would only show when Redis
// first ran it.
func TestScripts_CompileWithIncludesResolved(t *testing.T) {
	names, err := fs.Glob(files, "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		src := Source(name)
		if strings.Contains("\n"+src, "\n"+includeMark) {
			t.Errorf("%s: an include was left unresolved", name)
		}
		L := lua.NewState()
		// gopher-lua does not know shebang lines; Redis strips the line
		// before compiling, and a comment keeps the line numbers.
		if strings.HasPrefix(src, "#!") {
			src = "--" + src
		}
		if _, err := L.LoadString(src); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		L.Close()
	}
}

// A helper file is included at most once, however many files include it.
func TestSource_IncludesEachFileOnce(t *testing.T) {
	src := Source("excl_try.lua")
	if n := strings.Count(src, "local function now_parts()"); n != 1 {
		t.Fatalf("lib.lua included %d times", n)
	}
}

// The per-node renewal script keeps its shebang, which sets the flag that
// lets it reach keys of many slots, as its very first line.
func TestSource_ShebangStaysFirst(t *testing.T) {
	src := Source("renew_node.lua")
	if !strings.HasPrefix(src, "#!lua flags=allow-cross-slot-keys\n") {
		t.Fatalf("renew_node.lua does not open with its shebang: %.60q", src)
	}
	if strings.Count(src, "#!") != 1 || !strings.Contains(src, "local function renew_member(") {
		t.Fatal("renew_node.lua: want one shebang, then renew.lua")
	}
}
