package proccpu

import (
	"os"
	"testing"
	"time"
)

// TestStatCPU reads utime+stime past a command name that holds spaces and parentheses.
func TestStatCPU(t *testing.T) {
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 130 7 9 20 0 1 0 3314084 3133440 412\n"
	if got, want := StatCPU(line), 3800*time.Millisecond; got != want {
		t.Errorf("statCPU = %v, want %v (utime 250 + stime 130 ticks)", got, want)
	}
	for _, bad := range []string{"", "4242 (x", "4242 (x) S 1 2", "4242 (x) S 1 2 3 4 5 6 7 8 9 u s 7"} {
		if got := StatCPU(bad); got != -1 {
			t.Errorf("StatCPU(%q) = %v, want -1", bad, got)
		}
	}
	// This process's own line parses, and its time does not go back.
	self := []Process{{"self", os.Getpid()}}
	a := Times(self)[0]
	b := Times(self)[0]
	if a < 0 || b < a {
		t.Errorf("this process's CPU time: %v then %v", a, b)
	}
	if got := Times([]Process{{"gone", 1 << 30}})[0]; got != -1 {
		t.Errorf("a process that does not exist: %v, want -1", got)
	}
}

func TestParse(t *testing.T) {
	ps, err := Parse("server=12,redis=34,rlsload=self")
	if err != nil || len(ps) != 3 || ps[0] != (Process{"server", 12}) || ps[1] != (Process{"redis", 34}) ||
		ps[2] != (Process{"rlsload", os.Getpid()}) {
		t.Errorf("Parse = %v, %v", ps, err)
	}
	for _, bad := range []string{"", "server", "=12", "server=", "server=x", "server=-1", "a=1,"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}
