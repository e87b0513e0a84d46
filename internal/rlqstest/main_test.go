package rlqstest

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Filter and peer a test starts is gone when it ends: Close stops the
// sender and the receiver with the stream.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
