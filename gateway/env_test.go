package gateway_test

import "os"

func setenv(k, v string) error { return os.Setenv(k, v) }
