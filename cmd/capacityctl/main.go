// Command capacityctl operates the capacity service: API keys, nodes, reservations, topology,
// reclaims and the audit trail, against the local stack or any deployed environment. Run
// `capacityctl help` for the commands; docs/operating.md walks through them.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}, os.Getenv)
	stop()
	os.Exit(code)
}
