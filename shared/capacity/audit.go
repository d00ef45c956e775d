package capacity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// The audit trail of each node is a hash chain, after CloudTrail's log file integrity
// validation: every record carries its Seq in the node's chain, the Hash of the record before
// it (PrevHash) and its own Hash over its content with both. The chain's head (the last Seq and
// Hash) is kept on the node item and advanced in the same transaction as the record is put, so
// removing, altering or inserting a record breaks either the links or the head. Each node has
// two chains (NodeChain): its changes, and the calls that changed nothing.

// ChainAuditRecord returns the record appended to the chain whose head is given, and the new
// head: Seq head.Seq+1, PrevHash head.Hash, Hash over both.
func ChainAuditRecord(r AuditRecord, head AuditHead) (AuditRecord, AuditHead) {
	r.Seq, r.PrevHash = head.Seq+1, head.Hash
	r.Hash = HashAuditRecord(r)
	return r, AuditHead{Seq: r.Seq, Hash: r.Hash}
}

// Problems VerifyAuditChain and ConfirmHead report.
const (
	ChainAltered  = "altered"  // a record's hash does not match its content
	ChainInserted = "inserted" // a record that is not in the chain where it stands
	ChainRemoved  = "removed"  // records missing: a seq gap, a broken link, or a short chain
	// ChainBeyondHead: records past the head that a head read after them still does not
	// cover. A record is put in the transaction that moves the head to it, so the head was
	// moved back, or records were put past it by something other than the service.
	ChainBeyondHead = "beyond-head"
)

// ChainReport is the outcome of verifying a chain: OK, or the first problem found, naming the
// record (Seq, RecordID) and, for removed, the seqs missing (MissingFrom..MissingTo).
type ChainReport struct {
	OK bool
	// Checked counts the chained records verified up to the head's seq.
	Checked int
	// Past counts the records read past the head's seq. They are verified like the others
	// (each links to the one before, the first to the head): appended since the head was
	// read, or standing past a head moved back, which ConfirmHead tells apart.
	Past int
	// Last is the last chained record read (seq and hash).
	Last AuditHead
	// Unchained counts the records before the chain began (no seq, no hash). Pinned says the
	// chain's start pins them (their count and digest match it); when it is false they are
	// legacy records that nothing covers: counted and reported, never verified.
	Unchained int
	Pinned    bool

	Problem     string
	Seq         int64
	RecordID    string
	MissingFrom int64
	MissingTo   int64
	Detail      string
}

// ChainStartOf returns the pin of the unchained records that precede a chain, given in chain
// order: their number, and the hex SHA-256 of their hashes (HashAuditRecord), one a line.
func ChainStartOf(unchained []AuditRecord) ChainStart {
	h := sha256.New()
	for _, r := range unchained {
		fmt.Fprintln(h, HashAuditRecord(r))
	}
	return ChainStart{Unchained: int64(len(unchained)), Digest: hex.EncodeToString(h.Sum(nil))}
}

// VerifyAuditChain checks records (in chain order: unchained ones first, then by seq) against
// the head read before them. It reports the first problem: an unchained record timed after
// the chain began, or unchained records that do not match the start the head pins (inserted,
// removed, altered); a record whose hash does not match its content (altered); a record that
// is not where the chain places it, such as a second record with a seq or one out of order
// (inserted); a gap in the seqs, a record whose PrevHash is not the hash of the one before,
// or a chain that ends before the head or whose record at the head's seq is not the head's
// (removed). Records past the head are verified too, and counted in Past: run ConfirmHead
// on the report with the head read again after them.
func VerifyAuditChain(head AuditHead, records []AuditRecord) ChainReport {
	var rep ChainReport
	fail := func(problem string, r AuditRecord, detail string) ChainReport {
		rep.Problem, rep.Seq, rep.RecordID, rep.Detail = problem, r.Seq, r.ID, detail
		return rep
	}
	// Where the chain began, and which seqs are present (to tell a gap from disorder).
	var start *time.Time
	bySeq := map[int64]bool{}
	for _, r := range records {
		if r.Seq <= 0 {
			continue
		}
		if start == nil || r.Time.Before(*start) {
			t := r.Time
			start = &t
		}
		bySeq[r.Seq] = true
	}
	var unchained []AuditRecord
	for _, r := range records {
		if r.Seq > 0 {
			continue
		}
		if start != nil && r.Time.After(*start) {
			return fail(ChainInserted, r, fmt.Sprintf("unchained record timed %s, after the chain began at %s",
				r.Time.UTC().Format(time.RFC3339Nano), start.UTC().Format(time.RFC3339Nano)))
		}
		unchained = append(unchained, r)
		rep.Unchained++
	}
	// The pin: the head's, which must be the one the record that set it carries (a chain
	// pinned before its first record, as a seeded node's, has no such record).
	pin := head.Start
	for _, r := range records {
		if r.Seq <= 0 || r.Start == nil {
			continue
		}
		switch {
		case !pin.Pinned():
			return fail(ChainRemoved, r, fmt.Sprintf("record %d pinned the chain's start, and the head has no pin", r.Seq))
		case *r.Start != pin:
			return fail(ChainAltered, r, fmt.Sprintf("the head's start pin is not the one record %d set", r.Seq))
		}
		break
	}
	if rep.Pinned = pin.Pinned(); rep.Pinned {
		got := ChainStartOf(unchained)
		switch {
		case got.Unchained > pin.Unchained:
			return fail(ChainInserted, AuditRecord{}, fmt.Sprintf("%d unchained records precede the chain; its start pins %d", got.Unchained, pin.Unchained))
		case got.Unchained < pin.Unchained:
			return fail(ChainRemoved, AuditRecord{}, fmt.Sprintf("%d unchained records precede the chain; its start pins %d", got.Unchained, pin.Unchained))
		case got.Digest != pin.Digest:
			return fail(ChainAltered, AuditRecord{}, "the unchained records before the chain are not those its start pins")
		}
	}
	forged := forgedDuplicates(head, records)
	var last AuditRecord // the last chained record accepted (Seq 0: none yet)
	for i, r := range records {
		if r.Seq <= 0 {
			continue
		}
		if forged[i] || r.Seq <= last.Seq {
			return fail(ChainInserted, r, fmt.Sprintf("a second record with seq %d", r.Seq))
		}
		if HashAuditRecord(r) != r.Hash {
			return fail(ChainAltered, r, "hash does not match the record's content")
		}
		if want := last.Seq + 1; r.Seq > want {
			if bySeq[want] {
				return fail(ChainInserted, r, fmt.Sprintf("seq %d stands before seq %d", r.Seq, want))
			}
			rep.MissingFrom, rep.MissingTo = want, r.Seq-1
			return fail(ChainRemoved, r, fmt.Sprintf("records %d to %d are missing", want, r.Seq-1))
		}
		if r.PrevHash != last.Hash {
			rep.MissingFrom, rep.MissingTo = r.Seq-1, r.Seq-1
			return fail(ChainRemoved, r, fmt.Sprintf("prevHash is not the hash of record %d", r.Seq-1))
		}
		if r.Seq == head.Seq && r.Hash != head.Hash {
			rep.MissingFrom, rep.MissingTo = head.Seq, head.Seq
			return fail(ChainRemoved, r, fmt.Sprintf("the head's hash is not the hash of record %d", head.Seq))
		}
		last = r
		if r.Seq <= head.Seq {
			rep.Checked++
		} else {
			rep.Past++
		}
	}
	if last.Seq < head.Seq {
		rep.MissingFrom, rep.MissingTo = last.Seq+1, head.Seq
		return fail(ChainRemoved, last, fmt.Sprintf("the head is at seq %d; records %d to %d are missing", head.Seq, last.Seq+1, head.Seq))
	}
	rep.Last = AuditHead{Seq: last.Seq, Hash: last.Hash}
	rep.OK = true
	return rep
}

// ConfirmHead checks a report with records past its head against the head read again after
// the records. A record is put in the very transaction that moves the head to it, so that
// later head must cover every record read: at a later seq, or at the last one read with its
// hash. Otherwise the head was moved back (or records were put past it): beyond-head.
func ConfirmHead(rep ChainReport, later AuditHead) ChainReport {
	if !rep.OK || rep.Past == 0 || later.Seq > rep.Last.Seq || (later.Seq == rep.Last.Seq && later.Hash == rep.Last.Hash) {
		return rep
	}
	first := rep.Last.Seq - int64(rep.Past) + 1
	rep.OK, rep.Problem, rep.Seq, rep.RecordID = false, ChainBeyondHead, first, ""
	rep.Detail = fmt.Sprintf("records %d to %d stand past the head read before them (seq %d), and the head read after them is at seq %d: "+
		"the head was moved back, or records were put past it", first, rep.Last.Seq, first-1, later.Seq)
	return rep
}

// forgedDuplicates marks, among the chained records that share a seq, those the chain does not
// link to, by index: the genuine one is named by the PrevHash of a record with the next seq,
// or by the head.
func forgedDuplicates(head AuditHead, records []AuditRecord) map[int]bool {
	link := func(seq int64, hash string) string { return fmt.Sprintf("%d#%s", seq, hash) }
	linked := map[string]bool{link(head.Seq, head.Hash): true}
	count := map[int64]int{}
	for _, r := range records {
		if r.Seq > 0 {
			count[r.Seq]++
			linked[link(r.Seq-1, r.PrevHash)] = true
		}
	}
	forged := map[int]bool{}
	for i, r := range records {
		if r.Seq > 0 && count[r.Seq] > 1 && !linked[link(r.Seq, r.Hash)] {
			forged[i] = true
		}
	}
	return forged
}

// NodeChain names one of a node's two audit chains.
type NodeChain string

const (
	// ChainChanges holds the record of every call that changed the node's state, put in the
	// change's own transaction; its head is on the node item, which every commit conditions on.
	ChainChanges NodeChain = "changes"
	// ChainCalls holds the records of the calls that changed nothing: dry runs, refusals,
	// replays, and repeats that found nothing to change. Its head is an item no commit reads or conditions on, so these calls never
	// make a change go again.
	ChainCalls NodeChain = "calls"
)

// NodeChains are a node's chains, in the order they are verified.
var NodeChains = []NodeChain{ChainChanges, ChainCalls}

// nodeChain reads a chain's name ("" is the changes chain).
func nodeChain(name NodeChain) (NodeChain, error) {
	switch name {
	case "", ChainChanges:
		return ChainChanges, nil
	case ChainCalls:
		return ChainCalls, nil
	}
	return "", Errorf(CodeInvalidRequest, "chain must be %s or %s", ChainChanges, ChainCalls)
}

// AuditStore reads the audit trail. Implementations: shared/dynamo.Store.
type AuditStore interface {
	// ReservationAudit returns a page of a reservation's records on one of its node's chains
	// (its changes, or the calls about it that changed nothing), newest first.
	ReservationAudit(ctx context.Context, nodeID, reservationID string, chain NodeChain, limit int, cursor string) ([]AuditRecord, string, error)
	// NodeAudit reads the head of one of the node's chains (not_found if the node does not
	// exist), then a page of its records in chain order: unchained ones by time, then by seq.
	NodeAudit(ctx context.Context, nodeID string, chain NodeChain, limit int, cursor string) (AuditHead, []AuditRecord, string, error)
	// KeyAudit is NodeAudit for the key-management chain.
	KeyAudit(ctx context.Context, limit int, cursor string) (AuditHead, []AuditRecord, string, error)
}

// AuditPage is one page of a reservation's audit records, newest first.
type AuditPage struct {
	Records    []AuditRecord
	NextCursor string
}

// AuditChainPage is one page of a chain's records in chain order, with the chain's head as
// read before the records: a page may hold records appended since, past Head.Seq, which
// VerifyAuditChain ignores.
type AuditChainPage struct {
	Head       AuditHead
	Records    []AuditRecord
	NextCursor string
}

func (s *Service) auditStore() (AuditStore, error) {
	as, ok := s.Store.(AuditStore)
	if !ok {
		return nil, fmt.Errorf("store %T does not read the audit trail", s.Store)
	}
	return as, nil
}

// ListReservationAudit returns a page of a reservation's records, newest first: on chain ""
// or changes its changes (each call that changed it), on calls the calls about it that
// changed nothing (dry runs, refusals, replays, by whoever made them), to those who may move
// its capacity: an operator, the node's owner or a managing org. Anyone else gets the
// reservation's single 404.
func (s *Service) ListReservationAudit(ctx context.Context, p Principal, nodeID, reservationID string, chain NodeChain, page PageRequest) (*AuditPage, error) {
	r, access, err := s.visibleReservation(ctx, p, nodeID, reservationID)
	if err != nil {
		return nil, err
	}
	if access != AccessManage {
		return nil, notFound()
	}
	if chain, err = nodeChain(chain); err != nil {
		return nil, err
	}
	read, err := s.readAudit(page, "reservation "+r.ID, func(as AuditStore, limit int) (AuditHead, []AuditRecord, string, error) {
		recs, next, err := as.ReservationAudit(ctx, nodeID, r.ID, chain, limit, page.Cursor)
		return AuditHead{}, recs, next, err
	})
	if err != nil {
		return nil, err
	}
	return &AuditPage{Records: read.Records, NextCursor: read.NextCursor}, nil
}

// ListNodeAudit returns the head of one of the node's chains ("": changes) and a page of its
// records in chain order, to an operator holding audit.read only (anyone else: the single
// 404). It writes nothing.
func (s *Service) ListNodeAudit(ctx context.Context, p Principal, nodeID string, chain NodeChain, page PageRequest) (*AuditChainPage, error) {
	if !p.CanOperate(PermAuditRead) || !ValidID(nodeID) {
		return nil, nodeNotFound()
	}
	chain, err := nodeChain(chain)
	if err != nil {
		return nil, err
	}
	return s.readAudit(page, "node "+nodeID+" "+string(chain), func(as AuditStore, limit int) (AuditHead, []AuditRecord, string, error) {
		head, recs, next, err := as.NodeAudit(ctx, nodeID, chain, limit, page.Cursor)
		if ErrorCode(err) == CodeNotFound {
			err = nodeNotFound()
		}
		return head, recs, next, err
	})
}

// ListKeyAudit returns the key-management chain's head and a page of its records in chain
// order, to an operator holding audit.read only (anyone else: 404).
func (s *Service) ListKeyAudit(ctx context.Context, p Principal, page PageRequest) (*AuditChainPage, error) {
	if !p.CanOperate(PermAuditRead) {
		return nil, Errorf(CodeNotFound, "not found")
	}
	return s.readAudit(page, "API keys", func(as AuditStore, limit int) (AuditHead, []AuditRecord, string, error) {
		return as.KeyAudit(ctx, limit, page.Cursor)
	})
}

// readAudit reads a page of audit records (and a chain's head, where read gives one) with the
// page's limit, wrapping a failure that is not a domain error with what was read.
func (s *Service) readAudit(page PageRequest, what string, read func(AuditStore, int) (AuditHead, []AuditRecord, string, error)) (*AuditChainPage, error) {
	limit, err := page.limit()
	if err != nil {
		return nil, err
	}
	as, err := s.auditStore()
	if err != nil {
		return nil, err
	}
	head, recs, next, err := read(as, limit)
	if err != nil {
		if e := (*Error)(nil); errors.As(err, &e) {
			return nil, err
		}
		return nil, fmt.Errorf("list audit of %s: %w", what, err)
	}
	return &AuditChainPage{Head: head, Records: nonNilRecords(recs), NextCursor: next}, nil
}

func nonNilRecords(rs []AuditRecord) []AuditRecord {
	if rs == nil {
		return []AuditRecord{}
	}
	return rs
}
