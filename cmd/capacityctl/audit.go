package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/client"
	"github.com/openrelay/capacity/shared/wire"
)

// verifyPageSize is the largest page the API gives.
const verifyPageSize = 100

func auditList(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node, res := reservationFlags(fs)
	keys := fs.Bool("keys", false, "the key-management chain instead of a node's")
	limit, cursor := pageFlags(fs)
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if (*node == "") == !*keys || (*keys && *res != "") {
		return usageErr(fs, "name --node N (with --reservation R for one reservation's records) or --keys")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	page := client.Page{Limit: *limit, Cursor: *cursor}
	if *res != "" {
		out, meta, err := c.ListReservationAudit(ctx, *node, *res, page)
		if err != nil {
			return err
		}
		return emitPage(a, meta, auditHeader, out.Records, auditRow, out.NextCursor)
	}
	var out *wire.AuditChainPageJSON
	var meta *client.Meta
	columns, row := auditHeader, auditRow
	if *keys {
		out, meta, err = c.ListKeyAudit(ctx, page)
		columns, row = keyAuditHeader, keyAuditRow
	} else {
		out, meta, err = c.ListNodeAudit(ctx, *node, page)
	}
	if err != nil {
		return err
	}
	header := func(w io.Writer) {
		fmt.Fprintf(w, "head: seq %d %s\n\n", out.Head.Seq, dash(out.Head.Hash))
		columns(w)
	}
	return emitPage(a, meta, header, out.Records, row, out.NextCursor)
}

// verifyResult is audit verify's JSON output.
type verifyResult struct {
	Chain     string                `json:"chain"` // "node <id>" or "keys"
	Head      wire.AuditHeadJSON    `json:"head"`
	OK        bool                  `json:"ok"`
	Checked   int                   `json:"checked"`
	Unchained int                   `json:"unchained"`
	Problem   string                `json:"problem,omitempty"` // altered | inserted | removed
	Seq       int64                 `json:"seq,omitempty"`
	RecordID  string                `json:"recordId,omitempty"`
	Missing   []int64               `json:"missing,omitempty"` // removed: [from, to]
	Detail    string                `json:"detail,omitempty"`
	Record    *wire.AuditRecordJSON `json:"record,omitempty"` // the record the problem names
}

func newVerifyResult(chain string, head wire.AuditHeadJSON, rep capacity.ChainReport, rec *wire.AuditRecordJSON) verifyResult {
	out := verifyResult{Chain: chain, Head: head, OK: rep.OK, Checked: rep.Checked, Unchained: rep.Unchained,
		Problem: rep.Problem, Seq: rep.Seq, RecordID: rep.RecordID, Detail: rep.Detail, Record: rec}
	if rep.MissingFrom != 0 {
		out.Missing = []int64{rep.MissingFrom, rep.MissingTo}
	}
	return out
}

func auditVerify(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id")
	keys := fs.Bool("keys", false, "the key-management chain")
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if (*node == "") == !*keys {
		return usageErr(fs, "name exactly one chain: --node N or --keys")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	chain := "keys"
	fetch := func(p client.Page) (*wire.AuditChainPageJSON, *client.Meta, error) { return c.ListKeyAudit(ctx, p) }
	if *node != "" {
		chain = "node " + *node
		fetch = func(p client.Page) (*wire.AuditChainPageJSON, *client.Meta, error) {
			return c.ListNodeAudit(ctx, *node, p)
		}
	}
	head, raw, err := fetchChain(fetch)
	if err != nil {
		return err
	}
	records := make([]capacity.AuditRecord, 0, len(raw))
	for _, j := range raw {
		r, err := wire.AuditRecordFrom(j)
		if err != nil {
			// A record whose content cannot even be read is altered.
			return a.verifyFailed(chain, head, capacity.ChainReport{Problem: capacity.ChainAltered, Seq: j.Seq, RecordID: j.ID, Detail: err.Error()}, &j)
		}
		records = append(records, r)
	}
	h := capacity.AuditHead{Seq: head.Seq, Hash: head.Hash}
	rep := capacity.VerifyAuditChain(h, records)
	if !rep.OK {
		return a.verifyFailed(chain, head, rep, named(raw, rep))
	}
	if a.output == "json" {
		return printValue(a.io.out, newVerifyResult(chain, head, rep, nil))
	}
	fmt.Fprintf(a.io.out, "OK: audit chain of %s verified: %d records checked, %d unchained, head seq %d %s\n",
		chain, rep.Checked, rep.Unchained, head.Seq, dash(head.Hash))
	return nil
}

// fetchChain reads every page of a chain. The head is the last page's: it was read before
// that page's records and after all earlier pages, so every record up to it has been read.
func fetchChain(fetch func(client.Page) (*wire.AuditChainPageJSON, *client.Meta, error)) (wire.AuditHeadJSON, []wire.AuditRecordJSON, error) {
	var head wire.AuditHeadJSON
	var all []wire.AuditRecordJSON
	page := client.Page{Limit: verifyPageSize}
	seen := map[string]bool{}
	for {
		out, _, err := fetch(page)
		if err != nil {
			return head, nil, err
		}
		head = out.Head
		all = append(all, out.Records...)
		if out.NextCursor == "" {
			return head, all, nil
		}
		if seen[out.NextCursor] {
			return head, nil, fmt.Errorf("audit pages loop at cursor %s", out.NextCursor)
		}
		seen[out.NextCursor] = true
		page.Cursor = out.NextCursor
	}
}

// named returns the record a report names (by id, else by seq), or nil.
func named(records []wire.AuditRecordJSON, rep capacity.ChainReport) *wire.AuditRecordJSON {
	for i := range records {
		if rep.RecordID != "" && records[i].ID == rep.RecordID {
			return &records[i]
		}
	}
	for i := range records {
		if rep.RecordID == "" && rep.Seq != 0 && records[i].Seq == rep.Seq {
			return &records[i]
		}
	}
	return nil
}

func (a *app) verifyFailed(chain string, head wire.AuditHeadJSON, rep capacity.ChainReport, rec *wire.AuditRecordJSON) error {
	if a.output == "json" {
		if err := printValue(a.io.out, newVerifyResult(chain, head, rep, rec)); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.io.out, "FAILED: audit chain of %s: %s\n", chain, describe(rep, rec))
	}
	return failed(exitFailed, fmt.Errorf("audit chain of %s does not verify: %s record (seq %d, id %s)", chain, rep.Problem, rep.Seq, dash(rep.RecordID)))
}

// describe says what is wrong, naming the record.
func describe(rep capacity.ChainReport, rec *wire.AuditRecordJSON) string {
	what := map[string]string{
		capacity.ChainAltered:  "altered (its hash does not match its content)",
		capacity.ChainInserted: "inserted (not part of the chain)",
		capacity.ChainRemoved:  "removed (records missing from the chain)",
	}[rep.Problem]
	s := fmt.Sprintf("%s at record seq %d id %s", orDefault(what, rep.Problem), rep.Seq, dash(rep.RecordID))
	if rec != nil {
		s += fmt.Sprintf(" (time %s, action %s)", rec.Time, rec.Action)
	}
	if rep.Problem == capacity.ChainRemoved && rep.MissingFrom != 0 {
		s += fmt.Sprintf("; missing seq %d..%d", rep.MissingFrom, rep.MissingTo)
	}
	if rep.Detail != "" {
		s += "; " + rep.Detail
	}
	return s
}
