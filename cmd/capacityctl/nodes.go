package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/wire"
)

// The node view: which nodes a caller may see, what is on each unit of one, and a
// reservation's reclaim operations (docs/api.md, "Node view").

// unitStates are the unit states of the node view, in the order a node's summary counts them,
// each with its letter in the nodes list's strip and what it means (docs/api.md).
var unitStates = []struct{ state, letter, means string }{
	{"exclusive", "E", "reserved, idle, the reservation's own"},
	{"released", "R", "reserved, released to the spot market, idle"},
	{"spot", "S", "under a running spot VM"},
	{"terminating", "T", "under a VM being terminated (a reclaim's victim)"},
	{"occupied", "O", "under a running reserved or on-demand VM"},
	{"unreserved", "U", "in no reservation, idle"},
}

// hiddenUnit is the strip's letter for a unit of the node the caller may not see.
const hiddenUnit = "."

func stateLetter(state string) string {
	for _, s := range unitStates {
		if s.state == state {
			return s.letter
		}
	}
	return "?"
}

func nodesList(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	limit, cursor := pageFlags(fs)
	all := fs.Bool("all", false, "follow nextCursor through every page (--limit is then the page size)")
	states := fs.Bool("states", false, "add a strip of each node's unit states (one more request per node listed; table only)")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	page := client.Page{Limit: *limit, Cursor: *cursor}
	res, meta, err := c.ListNodes(ctx, page)
	if err != nil {
		return err
	}
	for *all && res.NextCursor != "" {
		page.Cursor = res.NextCursor
		more, _, err := c.ListNodes(ctx, page)
		if err != nil {
			return err
		}
		res.Nodes, res.NextCursor = append(res.Nodes, more.Nodes...), more.NextCursor
	}
	if a.output == "json" {
		if *all { // every page in one answer, in the API's shape
			return printValue(a.io.out, res)
		}
		return printJSON(a.io.out, meta.Body)
	}
	strips := map[string]string{}
	if *states {
		for _, n := range res.Nodes {
			strips[n.NodeID] = a.unitStrip(ctx, c, n)
		}
	}
	tw := newTable(a.io.out)
	header := "NODE\tOWNER\tUNITS\tTOPOLOGY GEN"
	if *states {
		header += "\tSTATES"
	}
	fmt.Fprintln(tw, header)
	for _, n := range res.Nodes {
		row := fmt.Sprintf("%s\t%s\t%s\t%d", cell(n.NodeID), orNotShown(n.OwnerOrgID), unitRange(n.UnitIDs), n.TopologyGen)
		if *states {
			row += "\t" + strips[n.NodeID]
		}
		fmt.Fprintln(tw, row)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(res.Nodes) == 0 {
		fmt.Fprintln(a.io.out, "no node you may see")
	}
	if *states && len(res.Nodes) > 0 {
		fmt.Fprintln(a.io.out, "\nstates, a letter per unit in the node's order: "+stripLegend())
	}
	if res.NextCursor != "" {
		next := []string{"nodes", "list", "--cursor", shellQuote(res.NextCursor)}
		if *limit != 0 {
			next = append(next, "--limit", strconv.Itoa(*limit))
		}
		if *states {
			next = append(next, "--states")
		}
		fmt.Fprintf(a.io.out, "\nnext page: %s (or --all for every page)\n", a.cmdline(next...))
	}
	if len(res.Nodes) > 0 {
		fmt.Fprintf(a.io.out, "\na node's units and the VMs on them: %s\n", a.cmdline("nodes", "describe", "--node", shellQuote(res.Nodes[0].NodeID)))
	}
	return nil
}

// unitStrip is a node's unit states, a letter a unit in the node's order ("." for a unit the
// caller may not see), or why they could not be read.
func (a *app) unitStrip(ctx context.Context, c *client.Client, n wire.NodeListingJSON) string {
	view, _, err := c.GetNodeUnits(ctx, n.NodeID)
	if err != nil {
		var pe *client.Error
		if errors.As(err, &pe) && pe.Code != "" {
			return "(unread: " + cell(pe.Code) + ")"
		}
		return "(unread)"
	}
	state := map[string]string{}
	for _, u := range view.Units {
		state[u.UnitID] = u.State
	}
	var b strings.Builder
	for _, id := range n.UnitIDs {
		if s, ok := state[id]; ok {
			b.WriteString(stateLetter(s))
		} else {
			b.WriteString(hiddenUnit)
		}
	}
	return b.String()
}

func stripLegend() string {
	parts := make([]string, 0, len(unitStates)+1)
	for _, s := range unitStates {
		parts = append(parts, s.letter+" "+s.state)
	}
	return strings.Join(append(parts, hiddenUnit+" not shown to you"), ", ")
}

// unitRange is a node's unit count and its first and last unit.
func unitRange(ids []string) string {
	switch len(ids) {
	case 0:
		return "0"
	case 1:
		return "1 (" + cell(ids[0]) + ")"
	}
	return fmt.Sprintf("%d (%s..%s)", len(ids), cell(ids[0]), cell(ids[len(ids)-1]))
}

// orNotShown is a value the API leaves out for callers that may not see it.
func orNotShown(s string) string {
	if s == "" {
		return "(not shown)"
	}
	return cell(s)
}

func nodesDescribe(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	c, err := a.connect(ctx, fs, args, "node")
	if err != nil {
		return err
	}
	view, meta, err := c.GetNodeUnits(ctx, *node)
	if err != nil {
		return err
	}
	if a.output == "json" {
		return printJSON(a.io.out, meta.Body)
	}
	// The unit view does not name the owner: the node does, to the operator and the owner
	// alone. Anyone else is told it is not shown (GET node answers them 404, as for none).
	owner := "(not shown)"
	n, _, err := c.GetNode(ctx, *node)
	var pe *client.Error
	switch {
	case err == nil:
		owner = cell(n.Node.OwnerOrgID)
	case !errors.As(err, &pe) || (pe.Status != http.StatusNotFound && pe.Status != http.StatusForbidden):
		return err
	}
	tw := newTable(a.io.out)
	describeNode(tw, *view, owner, a.now())
	if err := tw.Flush(); err != nil {
		return err
	}
	a.describeNext(*view)
	return nil
}

// describeNode prints the unit view kubectl-describe style: the node, its reservations, then
// a row a unit, and what each state shown means (the state is a word, never a colour).
func describeNode(w io.Writer, v wire.NodeUnitsJSON, owner string, now time.Time) {
	fmt.Fprintf(w, "Node:\t%s\n", cell(v.NodeID))
	fmt.Fprintf(w, "Owner org:\t%s\n", owner)
	fmt.Fprintf(w, "Topology gen:\t%d\n", v.TopologyGen)
	fmt.Fprintf(w, "Version:\t%d\n", v.Version)
	fmt.Fprintf(w, "Unit states:\t%s\n", stateCounts(v.Units))
	fmt.Fprintln(w)
	if len(v.Reservations) == 0 {
		fmt.Fprintln(w, "Reservations:\tnone")
	} else {
		fmt.Fprintln(w, "Reservations:")
		fmt.Fprintln(w, "  ID\tSTATUS\tACCESS\tRESERVED\tRELEASED")
		for _, r := range v.Reservations {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", cell(r.ID), cell(r.Status), cell(r.Access), join(r.ReservedUnitIDs), join(r.ReleasedUnitIDs))
		}
	}
	fmt.Fprintln(w)
	if len(v.Units) == 0 {
		fmt.Fprintln(w, "Units shown:\tnone")
		return
	}
	fmt.Fprintln(w, "Units:")
	fmt.Fprintln(w, "  UNIT\tSTATE\tRESERVATION\tMODE\tVM\tTIER\tVM STATE\tAGE")
	for _, u := range v.Units {
		vm, tier, vmState, age := "-", "-", "-", "-"
		if u.VM != nil {
			vm, tier, vmState, age = orNotShown(u.VM.VMID), cell(u.VM.Tier), cell(u.VM.State), ageSince(u.VM.Since, now)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(u.UnitID), cell(u.State), dash(u.ReservationID), dash(u.ReservationMode), vm, tier, vmState, age)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "States:")
	for _, s := range unitStates {
		for _, u := range v.Units {
			if u.State == s.state {
				fmt.Fprintf(w, "  %s\t%s\n", s.state, s.means)
				break
			}
		}
	}
}

// stateCounts is how many units are in each state, in unitStates' order.
func stateCounts(units []wire.UnitJSON) string {
	n := map[string]int{}
	for _, u := range units {
		n[u.State]++
	}
	var parts []string
	for _, s := range unitStates {
		if n[s.state] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[s.state], s.state))
			delete(n, s.state)
		}
	}
	for state, k := range n { // a state this capacityctl does not know yet
		parts = append(parts, fmt.Sprintf("%d %s", k, cell(state)))
	}
	if len(parts) == 0 {
		return "0 shown"
	}
	return fmt.Sprintf("%d shown: %s", len(units), strings.Join(parts, ", "))
}

// ageSince is how long ago since (RFC 3339) was, in the largest two units: 45s, 12m, 3h5m, 2d4h.
func ageSince(since string, now time.Time) string {
	t, err := time.Parse(time.RFC3339, since)
	if err != nil {
		return dash(since)
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 24*time.Hour:
		return trimZero(fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute)))
	}
	return trimZero(fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)))
}

// trimZero drops a zero second unit: 3h0m is 3h.
func trimZero(s string) string {
	if strings.HasSuffix(s, "h0m") || strings.HasSuffix(s, "d0h") {
		return s[:len(s)-2]
	}
	return s
}

// describeNext prints, for a reservation the caller manages with units on the spot market,
// the dry run that shows what reclaiming them would evict.
func (a *app) describeNext(v wire.NodeUnitsJSON) {
	for _, r := range v.Reservations {
		if r.Access != "manage" || len(r.ReleasedUnitIDs) == 0 {
			continue
		}
		fmt.Fprintf(a.io.out, "\nto see what reclaiming %s's released units would evict: %s\n", r.ID,
			a.cmdline("reclaim", "--dry-run", "--node", shellQuote(v.NodeID), "--reservation", shellQuote(r.ID), "--units", shellQuote(strings.Join(r.ReleasedUnitIDs, ","))))
		return
	}
}

// reclaimStates are the filters of reclaims list.
var reclaimStates = []string{"in-flight", "failed", "completed"}

func reclaimsList(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res := reservationFlags(fs)
	state := fs.String("state", "", "only the operations in this state: "+strings.Join(reclaimStates, ", ")+" (default: all)")
	limit, cursor := pageFlags(fs)
	if err := a.parseFlags(fs, args, "node", "reservation"); err != nil {
		return err
	}
	if *state != "" && !slices.Contains(reclaimStates, *state) {
		return usageErr(fs, "--state must be one of %s, not %q", strings.Join(reclaimStates, ", "), *state)
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	out, meta, err := c.ListReclaims(ctx, *node, *res, *state, client.Page{Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	if err := a.emit(meta, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tSTATE\tCREATED\tUNITS\tVMS (TERMINATED/FAILED/TOTAL)\tREASON")
		for _, op := range out.Reclaims {
			p := progressOf(&op)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d/%d/%d\t%s\n", cell(op.ID), cell(op.State), dash(op.CreatedAt), join(op.UnitIDs),
				p.terminated, p.failed, p.total, dash(op.Reason))
		}
	}); err != nil || a.output == "json" {
		return err
	}
	if len(out.Reclaims) == 0 {
		fmt.Fprintln(a.io.out, strings.Join(strings.Fields("no "+*state+" reclaim operation"), " "))
	}
	if out.NextCursor != "" {
		next := []string{"reclaims", "list", "--node", shellQuote(*node), "--reservation", shellQuote(*res), "--cursor", shellQuote(out.NextCursor)}
		if *state != "" {
			next = append(next, "--state", *state)
		}
		if *limit != 0 {
			next = append(next, "--limit", strconv.Itoa(*limit))
		}
		fmt.Fprintf(a.io.out, "\nnext page: %s\n", a.cmdline(next...))
	}
	if len(out.Reclaims) > 0 {
		fmt.Fprintf(a.io.out, "\none in full: %s\n", a.cmdline("reclaims", "get", "--node", shellQuote(*node), "--reservation", shellQuote(*res), "--reclaim", shellQuote(out.Reclaims[0].ID)))
	}
	return nil
}
