//go:build !unix

package watcher

import "testing"

func rerunAsNobody(t *testing.T, _ string) {
	t.Skip("running as another user needs a unix system; root ignores file permissions")
}
