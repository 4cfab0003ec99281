package d1idem

import (
	"cmp"
	"runtime/debug"
	"strings"
)

// modulePath is d1idem's module path.
const modulePath = "github.com/d1idem/d1idem"

// Version returns the version of d1idem the running program was built
// with: the module version a program that requires d1idem records for it
// ("v0.4.0", a pseudo-version; "devel" when replaced by a directory), or,
// for a program built in d1idem's own tree (cmd/d1idem), its version or
// "devel" with the VCS revision the build recorded ("devel (98428c9a1b2c,
// modified)"). Without build information it is "devel".
func Version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return versionOf(info)
}

func versionOf(info *debug.BuildInfo) string {
	if info.Main.Path != modulePath {
		for _, d := range info.Deps {
			if d.Path == modulePath {
				return cmp.Or(cmp.Or(d.Replace, d).Version, "devel")
			}
		}
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	rev = rev[:min(len(rev), 12)]
	switch {
	case rev == "":
		return v
	case strings.Contains(v, rev):
		// A pseudo-version names the revision already ("+dirty" when
		// modified).
		return v
	case modified == "true":
		return v + " (" + rev + ", modified)"
	}
	return v + " (" + rev + ")"
}
