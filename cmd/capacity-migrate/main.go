// Command capacity-migrate moves a deployed state table from the first item layout (every item
// of a node in its decision partition) to the live-only layout: terminated VMs to the node's
// history, reclaim operations and their outcomes to partitions of their own, each with its
// expiry; gives scheduled reclaims written before their reservation's list existed their
// place in it; and gives nodes, reservations and reclaim operations written before the node
// view's lists (the byList index) their entries; and moves reclaim operations from their
// state's single byState key to its shard (OPSTATE#<state>#<shard>; readers read the single
// key too until this has run). Run it once after deploying the release that reads the new
// layout:
//
//	capacity-migrate -table capacity-prod-state [-dry-run]
//
// With -report-operator-keys it reads the keys table instead and lists, as JSON, the live
// operator keys that hold no operator permission (issued before key.manage, node.manage,
// reservation.manage and audit.read existed): they reach no operator route any more. It
// changes nothing; replace them through the API (see docs/api.md, Permissions).
//
//	capacity-migrate -keys-table capacity-prod-keys -report-operator-keys
//
// Credentials, region and endpoint come from the usual AWS environment (AWS_PROFILE,
// AWS_REGION, AWS_ENDPOINT_URL for the local stack). Every move is one conditional
// transaction, so the command is idempotent and can be stopped and run again at any time. It
// prints what it moved as JSON and logs JSON to stdout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/wire"
)

func main() {
	// A command, not a function: it reads none of the functions' variables (envvar).
	logger := config.Logger(slog.LevelInfo)
	ctx := context.Background()
	err := run(ctx, os.Args[1:], os.Stdout, logger, func() (*dynamodb.Client, error) {
		cfg, err := config.AWS(ctx, config.Faults{})
		if err != nil {
			return nil, err
		}
		return dynamodb.NewFromConfig(cfg), nil
	})
	if err != nil {
		logger.Error("migration failed", "error", err.Error())
		os.Exit(1)
	}
}

// run parses the flags, migrates, and prints the report.
func run(ctx context.Context, args []string, out io.Writer, logger *slog.Logger, client func() (*dynamodb.Client, error)) error {
	fs := flag.NewFlagSet("capacity-migrate", flag.ContinueOnError)
	fs.SetOutput(out)
	tableName := fs.String("table", "", "state table to migrate, e.g. capacity-prod-state (required)")
	dryRun := fs.Bool("dry-run", false, "count what would move; write nothing")
	retention := fs.Duration("retention", dynamo.DefaultRetention, fmt.Sprintf("how long moved history is kept (at least %s)", dynamo.MinRetention))
	keysTable := fs.String("keys-table", "", "keys table, e.g. capacity-prod-keys (with -report-operator-keys)")
	reportKeys := fs.Bool("report-operator-keys", false, "list the operator keys without an operator permission; write nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *reportKeys {
		if *keysTable == "" {
			return errors.New("-report-operator-keys needs -keys-table")
		}
		c, err := client()
		if err != nil {
			return err
		}
		return reportOperatorKeys(ctx, c, *keysTable, out)
	}
	if *tableName == "" {
		return errors.New("-table is required")
	}
	if *retention < dynamo.MinRetention {
		return fmt.Errorf("-retention %s is under the minimum %s", *retention, dynamo.MinRetention)
	}
	c, err := client()
	if err != nil {
		return err
	}
	store := dynamo.New(c, *tableName, "")
	store.Retention = *retention
	start := time.Now()
	rep, err := store.Migrate(ctx, *dryRun, logger)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", *tableName, err)
	}
	return json.NewEncoder(out).Encode(struct {
		Table   string  `json:"table"`
		DryRun  bool    `json:"dryRun"`
		Seconds float64 `json:"seconds"`
		dynamo.MigrationReport
	}{*tableName, *dryRun, time.Since(start).Seconds(), rep})
}

// reportOperatorKeys prints the live operator keys of the table that hold no operator
// permission. It only reads.
func reportOperatorKeys(ctx context.Context, c *dynamodb.Client, keysTable string, out io.Writer) error {
	store := dynamo.New(c, "", "")
	store.KeysTable = keysTable
	now := time.Now()
	found := []wire.KeyJSON{}
	for after := ""; ; {
		keys, more, err := store.ListKeys(ctx, capacity.MaxPageLimit, after)
		if err != nil {
			return fmt.Errorf("read %s: %w", keysTable, err)
		}
		for _, k := range keys {
			if capacity.WithoutOperatorPermission(k, now) {
				found = append(found, wire.Key(k))
			}
		}
		if !more || len(keys) == 0 {
			break
		}
		after = keys[len(keys)-1].KeyID
	}
	return json.NewEncoder(out).Encode(struct {
		KeysTable string         `json:"keysTable"`
		Keys      []wire.KeyJSON `json:"operatorKeysWithoutOperatorPermission"`
	}{keysTable, found})
}
