package main

import (
	"context"
	"flag"
	"io"
	"strings"

	"github.com/openrelay/capacity/shared/client"
)

// What every API command shares, so that each states only its flags, its call and its table.

// parseFlags parses a command's flags (it takes no positional arguments) and checks that the
// named flags are set. A command checks its further rules after it and before a.client, so a
// wrong command line fails before anything needs an endpoint or a key.
func (a *app) parseFlags(fs *flag.FlagSet, args []string, need ...string) error {
	if _, err := a.parse(fs, args, 0); err != nil {
		return err
	}
	for _, name := range need {
		if f := fs.Lookup(name); f == nil || strings.TrimSpace(f.Value.String()) == "" {
			return usageErr(fs, "--%s is required", name)
		}
	}
	return nil
}

// connect is parseFlags, then the API client.
func (a *app) connect(ctx context.Context, fs *flag.FlagSet, args []string, need ...string) (*client.Client, error) {
	if err := a.parseFlags(fs, args, need...); err != nil {
		return nil, err
	}
	return a.client(ctx)
}

// writeFlags are the flags of every write: why (kept in the audit trail) and its
// Idempotency-Key.
func writeFlags(fs *flag.FlagSet) (reason, idem *string) {
	return fs.String("reason", "", "why"), fs.String("idempotency-key", "", "Idempotency-Key of the call")
}

// emitPage prints one page of a list: the header, a row per item, and the next page's cursor.
func emitPage[T any](a *app, meta *client.Meta, header func(io.Writer), items []T, row func(io.Writer, T), next string) error {
	return a.emit(meta, func(w io.Writer) {
		header(w)
		for _, it := range items {
			row(w, it)
		}
		nextCursor(w, next)
	})
}
