// Package proccpu reads the CPU time of processes from /proc/PID/stat, for the load generators
// of the benchmarks (bench/rlsload, bench/rlqsload): their -cpu NAME=PID,... flag and the time
// each process spent over a measured window.
package proccpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Process is a process to measure, by name and pid.
type Process struct {
	Name string
	PID  int
}

// Parse reads -cpu's NAME=PID,... ("self" as PID is this process).
func Parse(v string) ([]Process, error) {
	var ps []Process
	for _, f := range strings.Split(v, ",") {
		name, pid, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want NAME=PID", f)
		}
		if pid == "self" {
			ps = append(ps, Process{name, os.Getpid()})
			continue
		}
		n, err := strconv.Atoi(pid)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: the PID is not a process id", f)
		}
		ps = append(ps, Process{name, n})
	}
	return ps, nil
}

// clockTicks is the unit of /proc/PID/stat's times: USER_HZ, 100 a second on every Linux
// architecture Go supports (the kernel's ABI, whatever its own HZ).
const clockTicks = 100

// Times reads each process's CPU time so far, user and system (-1: unreadable, such as a process
// that has exited).
func Times(ps []Process) []time.Duration {
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
		if err != nil {
			out[i] = -1
			continue
		}
		out[i] = StatCPU(string(b))
	}
	return out
}

// StatCPU is utime+stime of a /proc/PID/stat line (fields 14 and 15, counted after the command
// name, which may hold spaces and parentheses: it ends at the last ")"), -1 if it has none.
func StatCPU(stat string) time.Duration {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(u+s) * time.Second / clockTicks
}
