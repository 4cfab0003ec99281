package d1idem

import (
	"runtime/debug"
	"testing"
)

func TestVersion(t *testing.T) {
	if Version() == "" {
		t.Error("Version() is empty")
	}
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "98428c9a1b2c3d4e5f60718293a4b5c6d7e8f901"}}
	modified := append(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"})
	own := debug.Module{Path: modulePath}
	app := debug.Module{Path: "example.com/app", Version: "v1.2.3"}
	for _, tc := range []struct {
		info debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "v0.4.0"}}, "v0.4.0"},
		{debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"}}, "devel"},
		{debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"}, Settings: modified}, "devel (98428c9a1b2c, modified)"},
		{debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "v0.0.0-20261202120000-98428c9a1b2c"}, Settings: rev}, "v0.0.0-20261202120000-98428c9a1b2c"},
		{debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "v0.4.0"}, Settings: rev}, "v0.4.0 (98428c9a1b2c)"},
		// A program that requires d1idem: d1idem's version, not the program's
		// nor its revision.
		{debug.BuildInfo{Main: app, Settings: rev, Deps: []*debug.Module{{Path: modulePath, Version: "v0.5.1"}}}, "v0.5.1"},
		{debug.BuildInfo{Main: app, Deps: []*debug.Module{{Path: modulePath, Version: "v0.5.1", Replace: &debug.Module{Path: "../d1idem"}}}}, "devel"},
		{debug.BuildInfo{Main: app, Deps: []*debug.Module{{Path: modulePath, Version: "v0.5.1", Replace: &debug.Module{Path: "example.com/fork", Version: "v0.5.2"}}}}, "v0.5.2"},
		{debug.BuildInfo{Main: own, Settings: rev}, "devel (98428c9a1b2c)"},
	} {
		if got := versionOf(&tc.info); got != tc.want {
			t.Errorf("versionOf(%+v, %v) = %q, want %q", tc.info.Main, tc.info.Deps, got, tc.want)
		}
	}
}
