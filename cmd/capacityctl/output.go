package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/wire"
)

// emit prints an answer: its JSON as the API sent it (indented) with --output json, else the
// table table writes.
func (a *app) emit(meta *client.Meta, table func(w io.Writer)) error {
	if a.output == "json" {
		return printJSON(a.io.out, meta.Body)
	}
	tw := newTable(a.io.out)
	table(tw)
	return tw.Flush()
}

// newTable aligns columns separated by tabs.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 2, 4, 2, ' ', 0) }

// printJSON prints raw JSON indented (as is if it is not JSON).
func printJSON(w io.Writer, raw []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// printValue prints v as indented JSON (for what capacityctl itself makes, not the API).
func printValue(w io.Writer, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return printJSON(w, raw)
}

func join(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return cell(strings.Join(s, ","))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

// cellEscapes keeps a value in its table cell: a tab or newline in it (text stored before
// the API refused them) would otherwise start a column or forge a row.
var cellEscapes = strings.NewReplacer("\t", `\t`, "\n", `\n`)

func cell(s string) string { return cellEscapes.Replace(s) }

// termSafe is what capacityctl writes through, to stdout and stderr alike: every character
// that would act on the terminal rather than be shown (ESC and the other C0 and C1 controls
// but the tab and newline capacityctl lays its own output out with, bidirectional controls,
// line separators) is written as a \uXXXX escape, and a byte that is not UTF-8 as \xNN. What
// the API or an error message says can then never clear the screen, recolour, hide or reorder
// text. Inside JSON strings, the only place a JSON answer can hold such a character, \uXXXX
// is the same character, so --output json stays valid and means the same.
type termSafe struct {
	w    io.Writer
	rest []byte // the start of a character that the next Write completes
}

func (t *termSafe) Write(p []byte) (int, error) {
	buf := append(t.rest, p...)
	t.rest = nil
	out := make([]byte, 0, len(buf))
	for len(buf) > 0 {
		r, size := utf8.DecodeRune(buf)
		switch {
		case r == utf8.RuneError && size <= 1 && !utf8.FullRune(buf):
			t.rest = bytes.Clone(buf)
			buf = nil
			continue
		case r == utf8.RuneError && size <= 1:
			out = fmt.Appendf(out, `\x%02x`, buf[0])
		case r != '\n' && r != '\t' && capacity.UnsafeRune(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, buf[:size]...)
		}
		buf = buf[size:]
	}
	_, err := t.w.Write(out)
	return len(p), err
}

func derefs(p *[]string) []string {
	if p == nil {
		return nil
	}
	return *p
}

func nodeTable(w io.Writer, n wire.NodeJSON) {
	fmt.Fprintf(w, "node\t%s\n", n.NodeID)
	fmt.Fprintf(w, "owner org\t%s\n", n.OwnerOrgID)
	fmt.Fprintf(w, "units\t%s\n", join(n.UnitIDs))
	fmt.Fprintf(w, "agent endpoint\t%s\n", dash(n.AgentEndpoint))
	fmt.Fprintf(w, "topology gen\t%d\n", n.TopologyGen)
	fmt.Fprintf(w, "version\t%d\n", n.Version)
	fmt.Fprintf(w, "audit head\tseq %d %s\n", n.AuditHead.Seq, dash(n.AuditHead.Hash))
	fmt.Fprintf(w, "agent key gen\t%d (rotated %s)\n", n.AgentKeyGen, dash(n.AgentKeyRotatedAt))
}

func reservationHeader(w io.Writer) {
	fmt.Fprintln(w, "ID\tSTATUS\tUNITS\tRELEASED\tALLOWED\tMANAGING\tSTARTS\tENDS\tGEN")
}

func reservationRow(w io.Writer, r wire.ReservationJSON) {
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", r.ID, r.Status, join(r.ReservedUnitIDs), join(r.ReleasedUnitIDs),
		join(r.AllowedOrgIDs), join(r.ManagingOrgIDs), dash(r.StartsAt), dash(r.EndsAt), r.TopologyGen)
}

func reservationTable(w io.Writer, r wire.ReservationJSON) {
	reservationHeader(w)
	reservationRow(w, r)
}

func vmTable(w io.Writer, title string, vms []wire.VMJSON) {
	if len(vms) == 0 {
		fmt.Fprintf(w, "%s: none\n", title)
		return
	}
	fmt.Fprintf(w, "%s:\n", title)
	fmt.Fprintln(w, "VM\tORG\tTIER\tUNITS\tSTATE")
	for _, v := range vms {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.ID, v.OrgID, v.Tier, join(v.UnitIDs), v.State)
	}
}

func keyHeader(w io.Writer) {
	fmt.Fprintln(w, "KEY ID\tORG\tPERMISSIONS\tOPERATOR\tREVOKED\tCREATED\tEXPIRES\tLAST USED\tDESCRIPTION")
}

func keyRow(w io.Writer, k wire.KeyJSON) {
	fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%v\t%s\t%s\t%s\t%s\n", k.KeyID, k.OrgID, join(k.Permissions), k.Operator, k.Revoked,
		dash(k.CreatedAt), dash(k.ExpiresAt), dash(k.LastUsedAt), dash(k.Description))
}

func auditHeader(w io.Writer) {
	fmt.Fprintln(w, "SEQ\tTIME\tACTION\tVIA\tORG\tKEY\tRESERVATION\tUNITS\tDRY RUN\tOUTCOME\tREASON")
}

func auditRow(w io.Writer, r wire.AuditRecordJSON) {
	fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\t%s\t%s\n", r.Seq, r.Time, r.Action, dash(r.Via), dash(r.CallerOrgID),
		dash(r.ActorKeyID), dash(r.ReservationID), join(r.UnitIDs), r.DryRun, dash(r.Outcome), dash(r.Reason))
}

// scheduledHeader and scheduledRow print scheduled reclaims: OUTCOME is the reclaim it ran, or
// why it was refused.
func scheduledHeader(w io.Writer) {
	fmt.Fprintln(w, "ID\tAT\tSTATE\tUNITS\tGRACE\tCREATED BY\tFIRED\tOUTCOME")
}

func scheduledRow(w io.Writer, sr wire.ScheduledReclaimJSON) {
	outcome := sr.ReclaimID
	if sr.Code != "" {
		outcome = sr.Code + ": " + sr.Detail
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", sr.ID, sr.At, sr.State, join(sr.UnitIDs), sr.GraceSeconds,
		dash(sr.CreatedByOrgID), dash(sr.FiredAt+sr.CancelledAt), dash(outcome))
}

// keyAuditHeader and keyAuditRow print the key-management chain: its records name the key
// created or revoked (targetKeyId) and no reservation, units or dry run.
func keyAuditHeader(w io.Writer) {
	fmt.Fprintln(w, "SEQ\tTIME\tACTION\tVIA\tORG\tKEY\tTARGET KEY\tOUTCOME\tREASON")
}

func keyAuditRow(w io.Writer, r wire.AuditRecordJSON) {
	fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time, r.Action, dash(r.Via), dash(r.CallerOrgID),
		dash(r.ActorKeyID), dash(r.TargetKeyID), dash(r.Outcome), dash(r.Reason))
}

// planTable prints a dry run's plan.
func planTable(w io.Writer, p wire.ReservationJSON) {
	fmt.Fprintf(w, "reservation\t%s on %s (%s, topology gen %d)\n", p.ID, p.NodeID, p.Status, p.TopologyGen)
	fmt.Fprintf(w, "would terminate\t%s\n", join(derefs(p.WouldTerminate)))
	fmt.Fprintf(w, "would skip\t%s\n", join(derefs(p.WouldSkip)))
	fmt.Fprintf(w, "plan ETag\t%s\n", dash(p.PlanETag))
}

func nextCursor(w io.Writer, c string) {
	if c != "" {
		fmt.Fprintf(w, "\nmore: --cursor %s\n", c)
	}
}
