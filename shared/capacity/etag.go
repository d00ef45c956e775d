package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ETag names the plan of a reclaim: a strong ETag (quoted) over what decides it, the
// reservation's version and the node's topology generation as read and the VMs it would
// terminate and skip. Any write to the reservation bumps its version, so a plan answered by
// a dry run is named again only if nothing it stands on has moved.
func (p *CapacityPlan) ETag() string {
	term, skip := VMIDs(p.Victims), VMIDs(p.Skipped)
	slices.Sort(term)
	slices.Sort(skip)
	text := fmt.Sprintf("v1\n%d\n%d\nT:%s\nS:%s", p.Reservation.Version, p.Node.TopologyGen,
		strings.Join(term, ","), strings.Join(skip, ","))
	sum := sha256.Sum256([]byte(text))
	return `"` + hex.EncodeToString(sum[:])[:32] + `"`
}

// ETagMatches reports whether an If-Match header value names etag: `*` matches any, and a
// comma-separated list matches if one member does; W/ prefixes and quotes are ignored.
func ETagMatches(ifMatch, etag string) bool {
	want := bareETag(etag)
	for _, m := range strings.Split(ifMatch, ",") {
		m = strings.TrimSpace(m)
		if m == "*" || (m != "" && bareETag(m) == want) {
			return true
		}
	}
	return false
}

func bareETag(s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "W/")
	return strings.Trim(s, `"`)
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
