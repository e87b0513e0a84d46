//go:build !unix

package clients

import "os"

// lockFile opens path; where there is no flock, nothing keeps a second process off the journal.
func lockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}

// unlockFile closes f.
func unlockFile(f *os.File) error { return f.Close() }
