package repotest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLicenses: the project's license is Apache-2.0 at the root, and every third-party file
// NOTICE names exists, with the license file NOTICE points to for it.
func TestLicenses(t *testing.T) {
	root := filepath.Join("..", "..")
	lic, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil || !strings.Contains(string(lic), "Apache License") || !strings.Contains(string(lic), "Version 2.0, January 2004") {
		t.Fatalf("LICENSE is not the Apache License 2.0 (%v)", err)
	}
	notice, err := os.ReadFile(filepath.Join(root, "NOTICE"))
	if err != nil {
		t.Fatal(err)
	}
	paths := regexp.MustCompile(`(?:web|licenses|internal|rls)/[A-Za-z0-9_./-]+[A-Za-z0-9_]`).FindAllString(string(notice), -1)
	if len(paths) < 5 {
		t.Fatalf("NOTICE names %d files: %q", len(paths), paths)
	}
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("NOTICE names %s: %v", p, err)
		}
	}
}
