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
	chain := fs.String("chain", "", "with --node (and --reservation): changes (the default: every call that changed the node or reservation) or calls (dry runs, refusals, replays)")
	limit, cursor := pageFlags(fs)
	if err := a.parseFlags(fs, args); err != nil {
		return err
	}
	if (*node == "") == !*keys || (*keys && *res != "") || (*chain != "" && *node == "") {
		return usageErr(fs, "name --node N (with --reservation R for one reservation's records, and --chain) or --keys")
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	page := client.Page{Limit: *limit, Cursor: *cursor}
	if *res != "" {
		out, meta, err := c.ListReservationAudit(ctx, *node, *res, *chain, page)
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
		out, meta, err = c.ListNodeAudit(ctx, *node, *chain, page)
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
	Chain     string             `json:"chain"` // "node <id>" or "keys"
	Head      wire.AuditHeadJSON `json:"head"`
	OK        bool               `json:"ok"`
	Checked   int                `json:"checked"`
	Unchained int                `json:"unchained"`
	// Pinned: the chain's start pins its unchained records; false: they are legacy records
	// nothing verifies.
	Pinned bool `json:"pinned"`
	// Past counts the records appended while verifying (past the head first read), checked
	// like the others and covered by the head read after them.
	Past int `json:"past"`
	// Keys (--keys): the keys checked against their records, and those the chain cannot
	// vouch for.
	KeysChecked    *int     `json:"keysChecked,omitempty"`
	LegacyKeys     []string `json:"legacyKeys,omitempty"`
	UnrecordedKeys []string `json:"unrecordedKeys,omitempty"`

	Problem  string                `json:"problem,omitempty"` // altered | inserted | removed | beyond-head
	Seq      int64                 `json:"seq,omitempty"`
	RecordID string                `json:"recordId,omitempty"`
	KeyID    string                `json:"keyId,omitempty"`   // a key that does not match its records
	Missing  []int64               `json:"missing,omitempty"` // removed: [from, to]
	Detail   string                `json:"detail,omitempty"`
	Record   *wire.AuditRecordJSON `json:"record,omitempty"` // the record the problem names

	// Calls (--node) is the node's calls chain, verified after its changes chain.
	Calls *verifyResult `json:"calls,omitempty"`

	rep capacity.ChainReport // for the text output
}

func newVerifyResult(chain string, head wire.AuditHeadJSON, rep capacity.ChainReport, rec *wire.AuditRecordJSON) verifyResult {
	out := verifyResult{Chain: chain, Head: head, OK: rep.OK, Checked: rep.Checked, Unchained: rep.Unchained,
		Pinned: rep.Pinned, Past: rep.Past, Problem: rep.Problem, Seq: rep.Seq, RecordID: rep.RecordID, Detail: rep.Detail, Record: rec}
	if rep.MissingFrom != 0 {
		out.Missing = []int64{rep.MissingFrom, rep.MissingTo}
	}
	return out
}

func auditVerify(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	node := fs.String("node", "", "node id (both its chains: changes, then calls)")
	keys := fs.Bool("keys", false, "the key-management chain, and every key against its records")
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
	if *keys {
		out, records, err := a.verifyChain("keys", func(p client.Page) (*wire.AuditChainPageJSON, *client.Meta, error) { return c.ListKeyAudit(ctx, p) })
		if err != nil {
			return err
		}
		kr, err := verifyKeys(ctx, c, records.decoded)
		if err != nil {
			return err
		}
		if !kr.OK {
			rep := capacity.ChainReport{Problem: kr.Problem, Seq: kr.Seq, Detail: kr.Detail}
			rec := named(records.raw, rep)
			if rec != nil {
				rep.RecordID = rec.ID
			}
			return a.verifyFailed(out.Chain, out.Head, rep, rec, kr.KeyID)
		}
		out.KeysChecked, out.LegacyKeys, out.UnrecordedKeys = &kr.Checked, kr.Legacy, kr.Unrecorded
		return a.printVerified([]verifyResult{out})
	}
	// A node's two chains: the changes (its head on the node item), then the calls that
	// changed nothing (dry runs, refusals, replays).
	var outs []verifyResult
	for _, chain := range capacity.NodeChains {
		name := "node " + *node
		if chain != capacity.ChainChanges {
			name += " " + string(chain)
		}
		out, _, err := a.verifyChain(name, func(p client.Page) (*wire.AuditChainPageJSON, *client.Meta, error) {
			return c.ListNodeAudit(ctx, *node, string(chain), p)
		})
		if err != nil {
			return err
		}
		if a.output != "json" {
			// Said as soon as known: a chain that verified is not hidden by the next one failing.
			if err := a.printVerified([]verifyResult{out}); err != nil {
				return err
			}
		}
		outs = append(outs, out)
	}
	if a.output == "json" {
		return a.printVerified(outs)
	}
	return nil
}

// chainRecords are a chain's records as read, and as decoded.
type chainRecords struct {
	raw     []wire.AuditRecordJSON
	decoded []capacity.AuditRecord
}

// verifyChain reads a whole chain and verifies it, reading the head again when records stand
// past the head first read. A chain that does not verify is reported (verifyFailed) and
// returned as the error.
func (a *app) verifyChain(chain string, fetch func(client.Page) (*wire.AuditChainPageJSON, *client.Meta, error)) (verifyResult, chainRecords, error) {
	head, raw, err := fetchChain(fetch)
	if err != nil {
		return verifyResult{}, chainRecords{}, err
	}
	records := make([]capacity.AuditRecord, 0, len(raw))
	for _, j := range raw {
		r, err := wire.AuditRecordFrom(j)
		if err != nil {
			// A record whose content cannot even be read is altered.
			return verifyResult{}, chainRecords{}, a.verifyFailed(chain, head, capacity.ChainReport{Problem: capacity.ChainAltered, Seq: j.Seq, RecordID: j.ID, Detail: err.Error()}, &j)
		}
		records = append(records, r)
	}
	rep := capacity.VerifyAuditChain(wire.AuditHeadFrom(head), records)
	if rep.OK && rep.Past > 0 {
		// Records past the head: appended while reading, if the head now covers them; if it
		// does not, the head was moved back.
		again, _, err := fetch(client.Page{Limit: 1})
		if err != nil {
			return verifyResult{}, chainRecords{}, fmt.Errorf("read the head of %s again: %w", chain, err)
		}
		rep = capacity.ConfirmHead(rep, wire.AuditHeadFrom(again.Head))
	}
	if !rep.OK {
		return verifyResult{}, chainRecords{}, a.verifyFailed(chain, head, rep, named(raw, rep))
	}
	out := newVerifyResult(chain, head, rep, nil)
	out.rep = rep
	return out, chainRecords{raw: raw, decoded: records}, nil
}

// printVerified prints chains that verified: as JSON the first, with a node's calls chain
// under it.
func (a *app) printVerified(outs []verifyResult) error {
	if a.output == "json" {
		out := outs[0]
		if len(outs) > 1 {
			out.Calls = &outs[1]
		}
		return printValue(a.io.out, out)
	}
	w := a.io.out
	for _, out := range outs {
		rep, head := out.rep, out.Head
		fmt.Fprintf(w, "OK: audit chain of %s verified: %d records checked, %d unchained, head seq %d %s\n",
			out.Chain, rep.Checked, rep.Unchained, head.Seq, dash(head.Hash))
		if rep.Past > 0 {
			fmt.Fprintf(w, "  %d records appended while verifying (seq %d to %d) were checked too, and the head now covers them\n",
				rep.Past, rep.Last.Seq-int64(rep.Past)+1, rep.Last.Seq)
		}
		if !rep.Pinned && (rep.Unchained > 0 || head.Seq > 0) {
			fmt.Fprintf(w, "WARNING: the chain's start is not pinned (no record appended since pins exist): its %d unchained records are legacy, and nothing verifies them\n", rep.Unchained)
		}
		if out.KeysChecked != nil {
			fmt.Fprintf(w, "  %d keys grant what their records say\n", *out.KeysChecked)
		}
		for _, k := range out.LegacyKeys {
			fmt.Fprintf(w, "WARNING: key %s: its records predate grants in records, so its grants cannot be checked\n", k)
		}
		for _, k := range out.UnrecordedKeys {
			fmt.Fprintf(w, "WARNING: key %s: no record in the chain (created outside the API: seeded, or written to the table); revoke it unless you know it\n", k)
		}
	}
	return nil
}

// verifyKeys reads every key and checks it against the chain's records.
func verifyKeys(ctx context.Context, c *client.Client, records []capacity.AuditRecord) (capacity.KeyReport, error) {
	var keys []capacity.APIKey
	page := client.Page{Limit: verifyPageSize}
	seen := map[string]bool{}
	for {
		out, _, err := c.ListKeys(ctx, page)
		if err != nil {
			return capacity.KeyReport{}, fmt.Errorf("list keys: %w", err)
		}
		for _, j := range out.Keys {
			k, err := wire.KeyFrom(j)
			if err != nil {
				return capacity.KeyReport{}, err
			}
			keys = append(keys, k)
		}
		if out.NextCursor == "" {
			return capacity.VerifyKeyGrants(records, keys), nil
		}
		if seen[out.NextCursor] {
			return capacity.KeyReport{}, fmt.Errorf("key pages loop at cursor %s", out.NextCursor)
		}
		seen[out.NextCursor] = true
		page.Cursor = out.NextCursor
	}
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

// verifyFailed reports a problem of the chain, or (keyID set) of a key that does not match
// the chain's records.
func (a *app) verifyFailed(chain string, head wire.AuditHeadJSON, rep capacity.ChainReport, rec *wire.AuditRecordJSON, keyID ...string) error {
	v := newVerifyResult(chain, head, rep, rec)
	if len(keyID) > 0 {
		v.KeyID = keyID[0]
	}
	if a.output == "json" {
		if err := printValue(a.io.out, v); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.io.out, "FAILED: audit chain of %s: %s\n", chain, describe(rep, rec, v.KeyID))
	}
	// Under --output json the report printed is the answer: ok false, and what is wrong.
	return &exitError{code: exitFailed, shown: true,
		err: fmt.Errorf("audit chain of %s does not verify: %s record (seq %d, id %s)", chain, rep.Problem, rep.Seq, dash(rep.RecordID))}
}

// describe says what is wrong, naming the record (and the key, if one does not match it).
func describe(rep capacity.ChainReport, rec *wire.AuditRecordJSON, keyID string) string {
	what := map[string]string{
		capacity.ChainAltered:  "altered (its hash does not match its content)",
		capacity.ChainInserted: "inserted (not part of the chain)",
		capacity.ChainRemoved:  "removed (records missing from the chain)",
		capacity.ChainBeyondHead: "beyond the head (records past a head that does not cover them: " +
			"the head was moved back)",
	}[rep.Problem]
	s := fmt.Sprintf("%s at record seq %d id %s", orDefault(what, rep.Problem), rep.Seq, dash(rep.RecordID))
	switch {
	case keyID != "":
		s = fmt.Sprintf("key %s %s (the key does not match its records) at record seq %d id %s", keyID, rep.Problem, rep.Seq, dash(rep.RecordID))
	case rep.Seq == 0 && rep.RecordID == "":
		s = orDefault(what, rep.Problem) + " before the chain"
	}
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
