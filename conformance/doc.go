// Package conformance holds pisync's conformance suite against real Pi: session files
// written by Pi itself (through conformance/pihelper) are mirrored by the pisync binary,
// rebuilt by `pisync recover`, and reopened by Pi, which must find the same entries,
// leaf and model context. See README.md in this directory. The package has no code of
// its own: everything is in its tests and in conformance/pitest.
package conformance
