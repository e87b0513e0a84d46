//go:build unix

package clients

import (
	"fmt"
	"os"
	"syscall"
)

// lockFile takes path (made if need be) for this process alone: a second process on the same
// journal would append beside this one's, each missing the other's writes. The lock ends with
// the file's close, or the process.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s is held by another process (one sluice per clients_file): %w", path, err)
	}
	return f, nil
}

// unlockFile gives the lock back, then closes f. The unlock comes first: a process forked at
// that moment (another goroutine starting a child) holds a copy of f until its exec closes it,
// and the lock, which belongs to the open file and not to this descriptor, would last as long.
func unlockFile(f *os.File) error {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return f.Close()
}
