// Package reporoot finds the repository's root from a test's working
// directory, for test helpers that use files beside the project (bin/,
// ../shared).
package reporoot

import (
	"errors"
	"os"
	"path/filepath"
)

// Find returns the nearest directory at or above the working directory
// that holds go.mod.
func Find() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("reporoot: no go.mod above the working directory")
		}
		dir = parent
	}
}
