package policy

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// RegexPrefix marks a Pattern that is a regular expression.
const RegexPrefix = "re:"

// Pattern matches one string value of a request. Written plainly it is
// the exact value; written "re:EXPR" it is an RE2 regular expression
// (Go's regexp syntax) that must match the whole value, as if anchored
// with ^(?:EXPR)$. A literal value that begins with "re:" is written as a
// regular expression: "re:re:\\.x" for "re:.x".
type Pattern string

// IsRegex reports whether p is a regular expression.
func (p Pattern) IsRegex() bool { return strings.HasPrefix(string(p), RegexPrefix) }

// Validate checks that a regular expression compiles.
func (p Pattern) Validate() error {
	if !p.IsRegex() {
		return nil
	}
	_, err := p.compile()
	return err
}

// Match reports whether s matches p. A pattern that does not compile
// (Validate refuses it) matches nothing.
func (p Pattern) Match(s string) bool {
	if !p.IsRegex() {
		return string(p) == s
	}
	re, err := p.compile()
	return err == nil && re.MatchString(s)
}

// String is p as written.
func (p Pattern) String() string { return string(p) }

// compiled caches the regular expressions of patterns: a policy has a
// bounded number of them, and they are matched on every request.
var compiled sync.Map // Pattern → *regexp.Regexp

func (p Pattern) compile() (*regexp.Regexp, error) {
	if re, ok := compiled.Load(p); ok {
		return re.(*regexp.Regexp), nil
	}
	re, err := regexp.Compile("^(?:" + strings.TrimPrefix(string(p), RegexPrefix) + ")$")
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", string(p), err)
	}
	compiled.Store(p, re)
	return re, nil
}

// MatchAny reports whether s matches one of ps.
func MatchAny(ps []Pattern, s string) bool {
	for _, p := range ps {
		if p.Match(s) {
			return true
		}
	}
	return false
}

// MatchList reports whether the list ss matches ps element by element.
func MatchList(ps []Pattern, ss []string) bool {
	if len(ps) != len(ss) {
		return false
	}
	for i, p := range ps {
		if !p.Match(ss[i]) {
			return false
		}
	}
	return true
}

// Strings returns ps as written.
func Strings(ps []Pattern) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}
