package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// commit and buildTime are set by `make release` (-ldflags "-X main.commit=… -X
// main.buildTime=…"); without them, the build's own record (debug.ReadBuildInfo) says
// what it can: the module version for `go install …@vX`, the VCS revision and time for
// a build in a checkout.
var (
	commit    = ""
	buildTime = ""
)

// buildVersion describes this binary: version, commit and build time, each "unknown"
// when neither the linker flags nor the build information carry it.
type buildVersion struct{ Version, Commit, Time, Go string }

func currentVersion() buildVersion {
	info, ok := debug.ReadBuildInfo()
	return describeBuild(version, commit, buildTime, info, ok)
}

// describeBuild merges the linker flags (preferred: `make release` knows the tag) with
// the build information.
func describeBuild(ver, com, when string, info *debug.BuildInfo, ok bool) buildVersion {
	v := buildVersion{Version: ver, Commit: com, Time: when, Go: runtime.Version()}
	if ok && info != nil {
		if (v.Version == "" || v.Version == "dev") && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v.Version = info.Main.Version
		}
		modified := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if v.Commit == "" {
					v.Commit = s.Value
				}
			case "vcs.time":
				if v.Time == "" {
					v.Time = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && com == "" && v.Commit != "" {
			v.Commit += "-dirty"
		}
		if info.GoVersion != "" {
			v.Go = info.GoVersion
		}
	}
	for _, f := range []*string{&v.Version, &v.Commit, &v.Time} {
		if *f == "" {
			*f = "unknown"
		}
	}
	return v
}

func (v buildVersion) String() string {
	return fmt.Sprintf("pisync %s\ncommit %s\nbuilt %s\n%s", v.Version, v.Commit, v.Time, v.Go)
}
