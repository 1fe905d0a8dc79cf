package fence

import "strings"

// quoteIdent returns name quoted as a PostgreSQL identifier: a lowercase
// name ([a-z_][a-z0-9_]*, as PostgreSQL stores an unquoted one), or with
// qualified, schema.name. Quoting lets reserved words such as "user" or
// "order" serve as names; requiring lowercase keeps a quoted name meaning
// what the same name unquoted means.
func quoteIdent(name string, qualified bool) (string, error) {
	parts := []string{name}
	if qualified {
		parts = strings.Split(name, ".")
		if len(parts) > 2 {
			return "", invalidf("table name %q: at most schema.table", name)
		}
	}
	for i, p := range parts {
		if !simpleIdent(p) {
			return "", invalidf("SQL name %q: want a lowercase identifier, [a-z_][a-z0-9_]*", name)
		}
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, "."), nil
}

func simpleIdent(s string) bool {
	if s == "" || len(s) > 63 { // PostgreSQL's NAMEDATALEN - 1
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
