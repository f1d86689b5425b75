package fsxfer

import (
	"bytes"
	"path"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
)

// A small .gitignore matcher on top of doublestar. The Go libraries for this are either
// unmaintained with known mismatches against git (sabhiram/go-gitignore, last change 2021)
// or part of a whole git implementation (go-git). Git's rules that matter for a walk:
//
//   - blank lines and lines starting with "#" are ignored; "\#" and "\!" escape;
//     trailing spaces are dropped unless escaped;
//   - "!" negates: a later match re-includes (but nothing below an excluded directory
//     is ever seen, as in git, because the walk does not enter it);
//   - a trailing "/" matches directories only;
//   - a pattern with a "/" at its start or middle is anchored to the .gitignore's
//     directory; otherwise it matches a name at any depth below it;
//   - "*", "?", "[…]" do not match "/"; "**" matches any number of directories.
//
// The last matching rule wins, and rules of deeper .gitignore files come later.

type ignoreRule struct {
	base    string // directory of the .gitignore, relative to the walk root ("" at the root)
	pattern string
	negate  bool
	dirOnly bool
	anchor  bool
}

// ignoreSet is the rules in force in one directory: its parents' and its own.
type ignoreSet struct {
	rules []ignoreRule
}

// maxIgnoreBytes bounds the .gitignore files read during a walk.
const maxIgnoreBytes = 256 << 10

func parseIgnore(base string, data []byte) []ignoreRule {
	var out []ignoreRule
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		s := strings.TrimSuffix(string(line), "\r")
		s = trimUnescapedSpaces(s)
		if s == "" || s[0] == '#' {
			continue
		}
		r := ignoreRule{base: base}
		if s[0] == '!' {
			r.negate, s = true, s[1:]
		} else if strings.HasPrefix(s, `\!`) || strings.HasPrefix(s, `\#`) {
			s = s[1:]
		}
		if strings.HasSuffix(s, "/") {
			r.dirOnly, s = true, strings.TrimRight(s, "/")
		}
		if s == "" {
			continue
		}
		if strings.Contains(s, "/") {
			r.anchor, s = true, strings.TrimPrefix(s, "/")
		}
		if !doublestar.ValidatePattern(s) {
			continue // git ignores what it cannot parse too
		}
		r.pattern = s
		out = append(out, r)
	}
	return out
}

func trimUnescapedSpaces(s string) string {
	for strings.HasSuffix(s, " ") && !strings.HasSuffix(s, `\ `) {
		s = s[:len(s)-1]
	}
	if strings.HasSuffix(s, `\ `) {
		s = s[:len(s)-2] + " "
	}
	return s
}

// with returns the set extended by rules (a new set: the parent's stays as it is).
func (s *ignoreSet) with(rules []ignoreRule) *ignoreSet {
	if len(rules) == 0 {
		return s
	}
	n := &ignoreSet{}
	if s != nil {
		n.rules = append(make([]ignoreRule, 0, len(s.rules)+len(rules)), s.rules...)
	}
	n.rules = append(n.rules, rules...)
	return n
}

// ignored reports whether rel (relative to the walk root) is excluded.
func (s *ignoreSet) ignored(rel string, isDir bool) bool {
	if s == nil {
		return false
	}
	for i := len(s.rules) - 1; i >= 0; i-- {
		r := s.rules[i]
		if r.dirOnly && !isDir {
			continue
		}
		sub := rel
		if r.base != "" {
			var ok bool
			if sub, ok = strings.CutPrefix(rel, r.base+"/"); !ok {
				continue
			}
		}
		var hit bool
		if r.anchor {
			hit, _ = doublestar.Match(r.pattern, sub)
		} else {
			hit, _ = doublestar.Match(r.pattern, path.Base(sub))
		}
		if hit {
			return !r.negate
		}
	}
	return false
}
