package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/stackoutput"
	"github.com/openrelay/capacity/shared/wire"
)

// ---- keys ----

func keysCreate(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	org := fs.String("org", "", "org the key acts for")
	perms := fs.String("permissions", "", "comma-separated, of: "+strings.Join(capacity.AllPermissions, ", ")+" (--bootstrap: all of them)")
	operator := fs.Bool("operator", false, "operator key, for your own org: its permissions reach every org (it grants none by itself)")
	expires := fs.String("expires", "", "expiry: RFC 3339 time or a duration from now (e.g. 720h)")
	desc := fs.String("description", "", "what the key is for")
	rate := fs.String("rate-limit", "", "the key's own rate limit, PER_SECOND/BURST (e.g. 5/10): at most the environment's (default: the environment's)")
	bootstrap := fs.Bool("bootstrap", false, "create the first operator key with AWS credentials on the stack's tables (not through the API)")
	idem := fs.String("idempotency-key", "", "Idempotency-Key of the call")
	if _, err := a.parse(fs, args, 0); err != nil {
		return err
	}
	if err := required(fs, "org", *org); err != nil {
		return err
	}
	exp, err := parseExpiry(*expires, time.Now())
	if err != nil {
		return usageErr(fs, "--expires: %v", err)
	}
	limit, err := parseRateLimit(*rate)
	if err != nil {
		return usageErr(fs, "--rate-limit: %v", err)
	}
	if *bootstrap {
		if limit != nil {
			return usageErr(fs, "--rate-limit is for keys created through the API, not --bootstrap")
		}
		return a.bootstrapKey(ctx, *org, list(*perms), exp, *desc, *idem)
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	req := client.KeyRequest{OrgID: *org, Permissions: list(*perms), Operator: *operator, Description: *desc, RateLimit: limit}
	if exp != nil {
		req.ExpiresAt = exp.Format(time.RFC3339)
	}
	res, meta, err := c.CreateKey(ctx, req, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		keyHeader(w)
		keyRow(w, res.Key)
		switch {
		case res.Secret != "":
			fmt.Fprintf(w, "\nsecret (shown once, store it now):\t%s\n", res.Secret)
		case res.SecretShown:
			fmt.Fprintln(w, "\nthe secret was shown by the first call with this Idempotency-Key; revoke and recreate the key if it is lost")
		}
	})
}

// parseRateLimit reads PER_SECOND/BURST ("" is none); the API checks the values.
func parseRateLimit(s string) (*wire.RateLimitJSON, error) {
	if s == "" {
		return nil, nil
	}
	rate, burst, ok := strings.Cut(s, "/")
	r, rerr := strconv.ParseFloat(rate, 64)
	b, berr := strconv.Atoi(burst)
	if !ok || rerr != nil || berr != nil {
		return nil, fmt.Errorf("want PER_SECOND/BURST, such as 5/10, not %q", s)
	}
	return &wire.RateLimitJSON{PerSecond: r, Burst: b}, nil
}

// parseExpiry reads an RFC 3339 time or a duration from now; "" is no expiry.
func parseExpiry(s string, now time.Time) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return nil, errors.New("want a positive duration")
		}
		t := now.Add(d).UTC().Truncate(time.Second)
		return &t, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, fmt.Errorf("want an RFC 3339 time or a duration, not %q", s)
	}
	t = t.UTC()
	return &t, nil
}

// bootstrapKey creates the first operator key with AWS credentials: it cannot be created
// through the API, which needs an operator key to create one. It goes through the domain on
// the tables themselves, as a bootstrap operator, so the key gets its id pointer and its
// record on the keys' audit chain (via "direct"), and a write whose answer was lost is found
// (the secret still shown) or replayed under the Idempotency-Key.
func (a *app) bootstrapKey(ctx context.Context, org string, perms []string, exp *time.Time, desc, idem string) error {
	out, err := a.stackOutputs(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, name := range []string{stackoutput.StateTableName, stackoutput.AuditTableName, stackoutput.KeysTableName} {
		if out[name] == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return &exitError{code: exitUsage, err: fmt.Errorf("--bootstrap needs the stack's %s: name the stack with --outputs FILE or --stack NAME", strings.Join(missing, ", "))}
	}
	if len(perms) == 0 {
		perms = capacity.AllPermissions
	}
	if idem == "" {
		idem = "bootstrap-" + capacity.NewID()
	}
	// Printed before the write: if it fails, or its answer is lost, a rerun with this key
	// finds the key it made (showing its secret once) instead of making a second one.
	fmt.Fprintf(a.io.err, "Idempotency-Key %s (if this fails, rerun with --idempotency-key %s)\n", idem, idem)
	cfg, err := a.aws(ctx)
	if err != nil {
		return err
	}
	store := dynamo.New(dynamodb.NewFromConfig(cfg), out[stackoutput.StateTableName], out[stackoutput.AuditTableName])
	store.KeysTable = out[stackoutput.KeysTableName]
	svc := &capacity.Service{Store: store, Keys: store,
		Logger: slog.New(slog.NewTextHandler(a.io.err, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	p := capacity.Bootstrap(org)
	req := capacity.KeyRequest{OrgID: org, Permissions: perms, Operator: true, ExpiresAt: exp, Description: desc, IdempotencyKey: idem}
	res, err := svc.CreateKey(ctx, p, req, capacity.RequestMeta{RequestID: idem, Via: capacity.ViaDirect})
	if err != nil {
		return fmt.Errorf("create the operator key in %s: %w", store.KeysTable, err)
	}
	if a.output == "json" {
		return printValue(a.io.out, wire.KeyAnswer(res))
	}
	fmt.Fprintf(a.io.out, "operator key %s for org %s written to %s\n", res.Key.KeyID, org, store.KeysTable)
	if res.Secret == "" {
		fmt.Fprintf(a.io.out, "the secret was shown by the first call with Idempotency-Key %s; revoke and recreate the key if it is lost\n", idem)
		return nil
	}
	fmt.Fprintf(a.io.out, "secret (shown once, store it now): %s\n", res.Secret)
	return nil
}

func pageFlags(fs *flag.FlagSet) (*int, *string) {
	return fs.Int("limit", 0, "page size (1..100; default the API's)"), fs.String("cursor", "", "the page after this cursor")
}

func keysList(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	limit, cursor := pageFlags(fs)
	if _, err := a.parse(fs, args, 0); err != nil {
		return err
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	res, meta, err := c.ListKeys(ctx, client.Page{Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		keyHeader(w)
		for _, k := range res.Keys {
			keyRow(w, k)
		}
		nextCursor(w, res.NextCursor)
	})
}

// whoamiCmd shows the calling key (GET /v1/keys/self): what it may do, so that a refusal
// elsewhere can be told apart from a missing permission.
func whoamiCmd(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	if _, err := a.parse(fs, args, 0); err != nil {
		return err
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	res, meta, err := c.SelfKey(ctx)
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		k := res.Key
		limit := "the environment's"
		if k.RateLimit != nil {
			limit = fmt.Sprintf("%g/s, burst %d", k.RateLimit.PerSecond, k.RateLimit.Burst)
		}
		fmt.Fprintf(w, "key\t%s\norg\t%s\noperator\t%v\npermissions\t%s\nexpires\t%s\nrate limit\t%s\n",
			k.KeyID, k.OrgID, k.Operator, join(k.Permissions), orDefault(k.ExpiresAt, "never"), limit)
	})
}

func keysRevoke(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	reason := fs.String("reason", "", "why")
	pos, err := a.parse(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, "name the key: capacityctl keys revoke KEY_ID")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	res, meta, err := c.RevokeKey(ctx, pos[0], *reason, client.Options{})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { keyHeader(w); keyRow(w, res.Key) })
}

// ---- nodes and topology ----

func nodesPut(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	owner := fs.String("owner", "", "owner org")
	units := fs.String("units", "", "comma-separated unit ids")
	agent := fs.String("agent-endpoint", "", "the node agent's URL (https outside the local stack)")
	reason, idem := writeFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "owner", "units", "agent-endpoint")
	if err != nil {
		return err
	}
	res, meta, err := c.PutNode(ctx, *node, client.NodeRequest{OwnerOrgID: *owner, UnitIDs: list(*units), AgentEndpoint: *agent, Reason: *reason},
		client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		nodeTable(w, res.Node)
		fmt.Fprintf(w, "created\t%v\n", res.Created)
		agentKeyLine(w, res.AgentKey, res.SecretShown)
	})
}

// agentKeyLine prints a node agent's new key, which an answer carries once, or that a replay
// does not carry it.
func agentKeyLine(w io.Writer, key string, shown bool) {
	switch {
	case key != "":
		fmt.Fprintf(w, "\nagent key (base64, shown once; install it on the node's agent now):\t%s\n", key)
	case shown:
		fmt.Fprintln(w, "\nthe agent key was shown by the first call with this Idempotency-Key")
	}
}

func nodesRotateKey(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	reason, idem := writeFlags(fs)
	c, err := a.connect(ctx, fs, args, "node")
	if err != nil {
		return err
	}
	res, meta, err := c.RotateAgentKey(ctx, *node, *reason, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		fmt.Fprintf(w, "node\t%s\n", res.NodeID)
		fmt.Fprintf(w, "agent key gen\t%d\n", res.AgentKeyGen)
		fmt.Fprintf(w, "previous key until\t%s\n", res.PreviousValidUntil)
		agentKeyLine(w, res.AgentKey, res.SecretShown)
	})
}

func nodesEndOverlap(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	reason, idem := writeFlags(fs)
	c, err := a.connect(ctx, fs, args, "node")
	if err != nil {
		return err
	}
	res, meta, err := c.EndAgentKeyOverlap(ctx, *node, *reason, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		fmt.Fprintf(w, "node\t%s\n", res.NodeID)
		fmt.Fprintf(w, "agent key gen\t%d\n", res.AgentKeyGen)
		fmt.Fprintf(w, "previous key until\t%s\n", res.PreviousValidUntil)
	})
}

func nodesGet(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	c, err := a.connect(ctx, fs, args, "node")
	if err != nil {
		return err
	}
	res, meta, err := c.GetNode(ctx, *node)
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { nodeTable(w, res.Node) })
}

func topologySet(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	units := fs.String("units", "", "the node's complete new unit list, comma-separated")
	gen := fs.Int64("expected-gen", 0, "refuse the change unless the node is at this topology generation (nodes get shows it)")
	reason, idem := writeFlags(fs)
	if err := a.parseFlags(fs, args, "node", "units"); err != nil {
		return err
	}
	genSet := false
	fs.Visit(func(f *flag.Flag) { genSet = genSet || f.Name == "expected-gen" })
	if genSet && *gen < 1 {
		return usageErr(fs, "--expected-gen must be at least 1")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	req := client.TopologyRequest{UnitIDs: list(*units), Reason: *reason, ExpectedTopologyGen: *gen}
	res, meta, err := c.SetTopology(ctx, *node, req, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		nodeTable(w, res.Node)
		fmt.Fprintf(w, "changed\t%v\n", res.Changed)
		fmt.Fprintf(w, "added units\t%s\n", join(res.AddedUnitIDs))
		fmt.Fprintf(w, "removed units\t%s\n", join(res.RemovedUnitIDs))
		fmt.Fprintf(w, "now needs review\t%s\n", join(res.NeedsReview))
		vmTable(w, "VMs on removed units (still running)", res.VMsOnRemovedUnits)
	})
}

// ---- reservations ----

func reservationsCreate(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	id := fs.String("id", "", "reservation id (default: generated)")
	status := fs.String("status", "", "active (default) or pending")
	starts := fs.String("starts", "", "start, RFC 3339 (default now)")
	ends := fs.String("ends", "", "end, RFC 3339 (default open-ended)")
	allowed := fs.String("allowed-orgs", "", "orgs that may use the units, comma-separated")
	managing := fs.String("managing-orgs", "", "orgs that may move the capacity, comma-separated")
	units := fs.String("units", "", "reserved unit ids, comma-separated")
	contract := fs.String("contract", "", "contract reference")
	reason, idem := writeFlags(fs)
	if err := a.parseFlags(fs, args, "node", "units", "allowed-orgs"); err != nil {
		return err
	}
	startsAt := time.Now().UTC().Format(time.RFC3339)
	for _, t := range []struct{ name, v string }{{"starts", *starts}, {"ends", *ends}} {
		if t.v == "" {
			continue
		}
		if _, err := time.Parse(time.RFC3339, t.v); err != nil {
			return usageErr(fs, "--%s: want an RFC 3339 time, not %q", t.name, t.v)
		}
	}
	if *starts != "" {
		startsAt = *starts
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	res, meta, err := c.CreateReservation(ctx, *node, client.ReservationRequest{
		ID: *id, Status: *status, StartsAt: startsAt, EndsAt: *ends, AllowedOrgIDs: list(*allowed),
		ManagingOrgIDs: list(*managing), ReservedUnitIDs: list(*units), ContractRef: *contract, Reason: *reason,
	}, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { reservationTable(w, res.Reservation) })
}

func reservationsList(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	limit, cursor := pageFlags(fs)
	c, err := a.connect(ctx, fs, args, "node")
	if err != nil {
		return err
	}
	res, meta, err := c.ListReservations(ctx, *node, client.Page{Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	return emitPage(a, meta, reservationHeader, res.Reservations, reservationRow, res.NextCursor)
}

func scheduledList(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res := reservationFlags(fs)
	limit, cursor := pageFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation")
	if err != nil {
		return err
	}
	out, meta, err := c.ListScheduledReclaims(ctx, *node, *res, client.Page{Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	return emitPage(a, meta, scheduledHeader, out.ScheduledReclaims, scheduledRow, out.NextCursor)
}

// reservationFlags are the flags naming one reservation.
func reservationFlags(fs *flag.FlagSet) (node, res *string) {
	return fs.String("node", "", "node id"), fs.String("reservation", "", "reservation id")
}

func reservationsGet(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res := reservationFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation")
	if err != nil {
		return err
	}
	r, meta, err := c.GetReservation(ctx, *node, *res)
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) { reservationTable(w, *r) })
}

func reservationsCancel(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	return reservationChange(ctx, a, fs, args, (*client.Client).CancelReservation, true)
}

func reservationsReaffirm(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	return reservationChange(ctx, a, fs, args, (*client.Client).ReaffirmReservation, false)
}

type changeFunc func(*client.Client, context.Context, string, string, string, client.Options) (*wire.ReservationAnswerJSON, *client.Meta, error)

func reservationChange(ctx context.Context, a *app, fs *flag.FlagSet, args []string, change changeFunc, showVMs bool) error {
	node, res := reservationFlags(fs)
	reason, idem := writeFlags(fs)
	c, err := a.connect(ctx, fs, args, "node", "reservation")
	if err != nil {
		return err
	}
	out, meta, err := change(c, ctx, *node, *res, *reason, client.Options{IdempotencyKey: *idem})
	if err != nil {
		return err
	}
	return a.emit(meta, func(w io.Writer) {
		reservationTable(w, out.Reservation)
		if showVMs && out.VMsOnUnits != nil {
			fmt.Fprintln(w)
			vmTable(w, "VMs on its units (still running; reclaim them before cancelling if they must go)", *out.VMsOnUnits)
		}
	})
}
