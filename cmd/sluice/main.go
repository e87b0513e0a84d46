// Command sluice is the rate limiter's command line:
//
//	sluice serve [--config FILE] [--listen ADDR] [--admin-listen ADDR]
//	sluice demo [--proxy URL] [--admin URL]
//	sluice check --config FILE
//	sluice simulate [policy flags] (--traffic PATTERN | --trace FILE) [--compare] [--format table|csv|json]
//	sluice web [--listen ADDR | --export DIR]
//	sluice version (or sluice --version)
//	sluice completion bash|zsh|fish|powershell
//	sluice ratelimit (or the binary named ratelimit: /bin/ratelimit in the image)
//
// Exit codes: 0 success (and --help), 1 the command failed at its work (e.g. writing its
// output), 2 a bad command line or bad input (flags, pattern, trace, policy); errors are one
// line on stderr, starting "sluice: ".
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // the time zone database, for hosts and images without /usr/share/zoneinfo

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command failed at its work
	exitUsage   = 2 // a bad command line or bad input
)

func main() {
	os.Exit(run(commandLine(os.Args), os.Stdin, os.Stdout, os.Stderr))
}

// commandLine is the command line run runs: argv's arguments, after "ratelimit" when the binary is
// called ratelimit (as envoyproxy/ratelimit's image starts /bin/ratelimit, with no arguments).
func commandLine(argv []string) []string {
	if filepath.Base(argv[0]) == ratelimitName {
		return append([]string{ratelimitName}, argv[1:]...)
	}
	return argv[1:]
}

// run runs the command line args (without the program name) and returns the exit code. Errors
// go to stderr as one line; help and results to stdout.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCommand(stdin)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	initCompletion(root)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ce configError
	if errors.As(err, &ce) {
		fmt.Fprintf(stderr, "sluice: the configuration has errors:\n%s\n", err.Error())
		return exitUsage
	}
	fmt.Fprintf(stderr, "sluice: %s\n", oneLine(err.Error()))
	var f failure
	if errors.As(err, &f) {
		return exitFailure
	}
	return exitUsage
}

// failure marks an error of the command's work rather than of its input: exit code 1.
// Every other error is the user's to fix: exit code 2.
type failure struct{ err error }

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

// newRootCommand builds the command tree. Subcommands add themselves here, one constructor each
// (newServeCommand, newDemoCommand, newCheckCommand, newSimulateCommand, newWebCommand, newVersionCommand,
// newRatelimitCommand, newClientsCommand).
func newRootCommand(stdin io.Reader) *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "sluice: a distributed rate limiter for HTTP APIs",
		Long: `sluice decides, for every request, whether a client may go on now, must wait, or is refused,
and decides the same way on every gateway instance.

Try:
  sluice serve                      # the gateway's demo, on the in-memory store
  sluice demo                       # then, in another terminal: 429s and held requests
  sluice serve --config sluice.yaml # in front of your API (see docs/config.md)
  sluice check --config sluice.yaml # check a configuration without starting
  sluice clients list               # clients managed at runtime, on a running instance
  sluice simulate --compare --limit 5 --period 1s --burst 40 \
      --traffic "5/s for 10s; 40 in 1s; 5/s for 10s"

Exit codes: 0 success, 1 the command failed at its work, 2 a bad command line or input.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return unknownCommand(cmd, args[0])
		},
		SilenceErrors: true, // run prints the one-line error
		SilenceUsage:  true, // a value error is not a reason to print the usage
	}
	root.Version = versionString()
	root.SetVersionTemplate("sluice {{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())
	})
	root.AddCommand(newServeCommand(), newDemoCommand(), newCheckCommand(), newSimulateCommand(stdin), newVersionCommand(), newWebCommand(), newRatelimitCommand(), newClientsCommand())
	return root
}

// initCompletion adds cobra's completion command (sluice completion bash|zsh|fish|powershell
// prints the shell's script) to root, once root's output is set (its
// scripts go to the output of that moment).
func initCompletion(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			// Not cobra's help, with exit code 0, for a shell it has no script for.
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) == 0 {
					return cmd.Help()
				}
				return fmt.Errorf("completion: unknown shell %q: want bash, zsh, fish or powershell", args[0])
			}
		}
	}
}

func unknownCommand(root *cobra.Command, name string) error {
	var names []string
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	if s := root.SuggestionsFor(name); len(s) > 0 {
		return fmt.Errorf("unknown command %q: did you mean %q? (see sluice --help)", name, s[0])
	}
	return fmt.Errorf("unknown command %q: want one of %s (see sluice --help)", name, strings.Join(names, ", "))
}

// oneLine joins the lines of a message, so that every error is one line on stderr.
func oneLine(msg string) string {
	var parts []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}
