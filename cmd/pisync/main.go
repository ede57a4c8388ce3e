// Command pisync mirrors Pi agent session files into NATS JetStream and rebuilds them from
// there. See the README for the commands and their flags.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes: 0 success, 1 failure, 2 usage error.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// errUsage marks an error caused by the command line.
var errUsage = errors.New("usage")

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs one subcommand and returns its exit code. The first SIGINT or SIGTERM starts a
// graceful shutdown; a second one aborts it.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
			return
		}
		select {
		case <-sigs:
			fmt.Fprintln(stderr, "pisync: second signal, aborting")
			os.Exit(exitFail)
		case <-ctx.Done():
		}
	}()

	var err error
	switch args[0] {
	case "run":
		err = RunCommand(ctx, args[1:], stdout, stderr)
	case "recover":
		err = RecoverCommand(ctx, args[1:], stdout, stderr)
	case "serve":
		err = ServeCommand(ctx, args[1:], stdout, stderr)
	case "history":
		err = HistoryCommand(ctx, args[1:], stdout, stderr)
	case "status":
		err = StatusCommand(ctx, args[1:], stdout, stderr)
	case "verify":
		err = VerifyCommand(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, currentVersion())
		return exitOK
	default:
		fmt.Fprintf(stderr, "pisync: unknown command %q; try 'pisync help'\n", args[0])
		return exitUsage
	}
	return exitCode(err, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "pisync:", err)
		return exitUsage
	case errors.Is(err, errSilent):
		return exitFail
	default:
		fmt.Fprintln(stderr, "pisync:", err)
		return exitFail
	}
}

// errSilent is a failure already reported in the command's own output.
var errSilent = errors.New("failed")

// version is set at build time (-ldflags "-X main.version=…").
var version = "dev"

const usage = `pisync mirrors Pi agent session files into NATS JetStream.

Usage:
  pisync run [--root DIR]... [--state-dir DIR] [--nats URL] [--nats-listen HOST:PORT]
             [--http-addr HOST:PORT] [--tenant T] [--owner O]
  pisync recover (--conversation ID... | --all) [--root DIR]... [--out DIR]
                 [--generation N | --at TIME] [--dry-run] [--force] [--drop-raw] [--json]
                 [--parallel N]
  pisync history CONVERSATION [--json]
  pisync status [--root DIR]... [--host NAME] [--json]
  pisync verify [--root DIR]... [--host NAME] [--json]
  pisync serve [--nats URL] [--http-addr HOST:PORT] [--prefix P] [--provision MODE]
  pisync version

Every command reaches NATS with --nats URL (default: the embedded server on --nats-listen),
--tenant, --owner, and --nats-user/--nats-password, --nats-token, --nats-nkey FILE,
--nats-creds FILE, --tls-ca FILE, --tls-cert FILE, --tls-key FILE, --tls-server-name NAME.
Every flag also reads a PISYNC_* environment variable (--state-dir: PISYNC_STATE_DIR).
Run 'pisync COMMAND -h' for the flags of a command.
`
