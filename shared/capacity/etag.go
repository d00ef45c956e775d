package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// ETag names the plan of a reclaim: a strong ETag (quoted) over everything that makes it,
// so that If-Match admits only the very plan a dry run showed: the node and reservation, the
// reservation's version and the node's topology generation as read, the units asked for (a
// set: sorted), the reservation's released units after the call, the grace before the
// termination, and the VMs it would terminate and skip. Any write to the reservation bumps
// its version, so a plan answered by a dry run is named again only if nothing it stands on
// has moved; and an ETag of a reclaim of [u1] never admits one of [u1,u2], nor one with
// another grace.
func (p *CapacityPlan) ETag() string {
	b, _ := json.Marshal(struct {
		V                 int
		Action            string
		Node, Reservation string
		Version, Gen      int64
		Units, Released   []string
		GraceSeconds      int64
		Terminate, Skip   []string
	}{
		V: 2, Action: p.Action, Node: p.Node.ID, Reservation: p.Reservation.ID,
		Version: p.Reservation.Version, Gen: p.Node.TopologyGen,
		Units: sortedSet(p.UnitIDs), Released: sortedSet(p.Released), GraceSeconds: int64(p.Grace / time.Second),
		Terminate: sortedSet(VMIDs(p.Victims)), Skip: sortedSet(VMIDs(p.Skipped)),
	})
	sum := sha256.Sum256(b)
	return `"` + hex.EncodeToString(sum[:])[:32] + `"`
}

// ParseIfMatch parses an If-Match field value (RFC 9110 13.1.1): "*" alone (any is true), or
// a comma-separated list of entity tags, each `"..."` with an optional W/ (ignored), empty
// list members allowed. It answers the tags without quotes. ok is false for anything else,
// an unquoted tag, "*" inside a list, or a value that names no tag at all: such a header is
// a client's mistake, never "no precondition".
func ParseIfMatch(v string) (tags []string, any bool, ok bool) {
	if strings.TrimSpace(v) == "*" {
		return nil, true, true
	}
	for rest := v; ; {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			break
		}
		if rest[0] == ',' {
			rest = rest[1:]
			continue
		}
		rest = strings.TrimPrefix(rest, "W/")
		if rest == "" || rest[0] != '"' {
			return nil, false, false
		}
		end := strings.IndexByte(rest[1:], '"')
		if end < 0 {
			return nil, false, false
		}
		tag := rest[1 : 1+end]
		for i := 0; i < len(tag); i++ {
			// etagc: %x21 / %x23-7E / obs-text
			if c := tag[i]; c < 0x21 || c == 0x7f {
				return nil, false, false
			}
		}
		tags = append(tags, tag)
		rest = strings.TrimLeft(rest[2+end:], " \t")
		if rest != "" && rest[0] != ',' {
			return nil, false, false
		}
	}
	return tags, false, len(tags) > 0
}

// ETagMatches reports whether an If-Match header value names etag: `*` matches any, and a
// list matches if one member does; W/ prefixes are ignored. A malformed value matches
// nothing.
func ETagMatches(ifMatch, etag string) bool {
	tags, any, ok := ParseIfMatch(ifMatch)
	return ok && (any || slices.Contains(tags, strings.Trim(etag, `"`)))
}

// checkIfMatch refuses a real reclaim sent with If-Match whose plan is not the one named,
// answering the plan as it is now (what a dry run would answer).
func (p *CapacityPlan) checkIfMatch(ifMatch string, audit AuditRecord, now time.Time) error {
	if ifMatch == "" || p.DryRun || p.Action != ActionReclaim {
		return nil
	}
	etag := p.ETag()
	if ETagMatches(ifMatch, etag) {
		return nil
	}
	dry := *p
	dry.DryRun = true
	_, current, _ := dry.Commit("", audit, now)
	return &Error{Code: CodePlanChanged, Message: "the reclaim's plan has changed; the current plan is " + etag, Plan: &current}
}
