package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/routes"
	"github.com/openrelay/capacity/shared/wire"
)

// Transport-level codes: the request could not be read as a call at all.
const (
	CodeMalformedRequest     capacity.Code = "malformed_request"
	CodeBodyTooLarge         capacity.Code = "body_too_large"
	CodeUnsupportedMediaType capacity.Code = "unsupported_media_type"
	CodeMethodNotAllowed     capacity.Code = "method_not_allowed"
)

// StatusOf maps every error code to its HTTP status. It is the only place that does.
func StatusOf(code capacity.Code) int {
	switch code {
	case CodeMalformedRequest:
		return http.StatusBadRequest
	case capacity.CodeUnauthenticated:
		return http.StatusUnauthorized
	case capacity.CodeForbidden:
		return http.StatusForbidden
	case capacity.CodeNotFound:
		return http.StatusNotFound
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case capacity.CodeReservationNotActive, capacity.CodeOutsideTerm, capacity.CodeTopologyChanged,
		capacity.CodeUnitsInUse, capacity.CodeUnitsUnavailable, capacity.CodeVMExists,
		capacity.CodeConcurrentModification, capacity.CodeOperationRunning,
		capacity.CodeScheduledReclaimCancelled, capacity.CodeScheduledReclaimFired,
		capacity.CodeCreatorKeyInvalid, capacity.CodeScheduledReclaimNotDue, capacity.CodeScheduledReclaimLimit,
		capacity.CodeReservationExists, capacity.CodeReservationOverlap, capacity.CodeInvalidTransition:
		return http.StatusConflict
	case capacity.CodePlanChanged:
		return http.StatusPreconditionFailed
	case CodeBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case capacity.CodeInvalidRequest, capacity.CodeUnitsNotReserved, capacity.CodeUnknownUnits,
		capacity.CodeIdempotencyKeyReused, capacity.CodeInsufficientUnits:
		return http.StatusUnprocessableEntity
	case capacity.CodeRateLimited:
		return http.StatusTooManyRequests
	case capacity.CodeThrottled, capacity.CodeUnavailable:
		return http.StatusServiceUnavailable
	case capacity.CodeSchedulingUnavailable:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// ErrorsPagePath is the page of errors and their fixes, under the API's base path: one section
// per code (id = the code), rendered from docs/errors.md and served by the console beside the
// API, so the page is there on every deployment that answers the problem.
const ErrorsPagePath = routes.ConsolePath + "/errors.html"

// ProblemType is the type URI of code's problems: its section of the errors page of the API
// at apiBase (scheme, host and base path: "https://abc.execute-api.eu-west-1.amazonaws.com/prod").
// With apiBase "" it is the path-absolute reference of an API at its host's root.
func ProblemType(apiBase string, code capacity.Code) string {
	return strings.TrimSuffix(apiBase, "/") + ErrorsPagePath + "#" + string(code)
}

// apiBaseURL is the address the API was called under, before its routes: the request's scheme
// (X-Forwarded-Proto, which API Gateway sets) and host, and the base path (Handler.BasePath);
// the base path alone when the host is not a plain host[:port].
func (h *Handler) apiBaseURL(r *http.Request) string {
	host := r.Header.Get("Host") // API Gateway's event has it; net/http moves it to r.Host
	if host == "" {
		host = r.Host
	}
	base := ""
	if h.BasePath != nil {
		base = strings.TrimSuffix(h.BasePath(r), "/")
	}
	if !validHost(host) {
		return base
	}
	scheme := "http"
	switch proto := strings.ToLower(r.Header.Get("X-Forwarded-Proto")); {
	case proto == "https" || proto == "http":
		scheme = proto
	case r.TLS != nil:
		scheme = "https"
	}
	return scheme + "://" + host + base
}

// validHost reports whether host is a DNS name or IPv4 address with an optional port: nothing
// a caller could use to turn the type URI into another kind of address.
func validHost(host string) bool {
	if host == "" || len(host) > 260 {
		return false
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == ':') {
			return false
		}
	}
	return true
}

// Problem is an RFC 9457 problem details body, with the machine code as an extension.
type Problem struct {
	Type    string        `json:"type"`
	Title   string        `json:"title"`
	Status  int           `json:"status"`
	Detail  string        `json:"detail"`
	Code    capacity.Code `json:"code"`
	UnitIDs []string      `json:"unitIds,omitempty"`
	// Plan (plan_changed) is the plan the reclaim would carry out now, as a dry run answers
	// it; its planEtag is also the answer's ETag.
	Plan *wire.ReservationJSON `json:"plan,omitempty"`
	// Available (insufficient_units) is how many units a reclaim of the reservation could take.
	Available *int `json:"available,omitempty"`
	// ExpiredAt (unauthenticated, RFC 3339) is when the caller's own key expired; only for an
	// expired key whose secret the caller sent.
	ExpiredAt string `json:"expiredAt,omitempty"`
	// retryAfter (seconds, 0: none) goes in the Retry-After header, not the body.
	retryAfter int
}

// problemOf is err's problem, its type under apiBase (ProblemType).
func problemOf(err error, apiBase string) Problem {
	code := capacity.ErrorCode(err)
	status := StatusOf(code)
	p := Problem{
		Type: ProblemType(apiBase, code), Title: http.StatusText(status), Status: status,
		Detail: capacity.ErrorMessage(err), Code: code,
	}
	var e *capacity.Error
	if errors.As(err, &e) {
		p.UnitIDs, p.Available = e.UnitIDs, e.Available
		if e.ExpiredAt != nil {
			p.ExpiredAt = e.ExpiredAt.UTC().Format(time.RFC3339)
		}
		if e.RetryAfter > 0 {
			p.retryAfter = capacity.RetryAfterSeconds(e.RetryAfter)
		}
		if e.Plan != nil {
			res := *e.Plan
			res.DryRun = true // the body a dry run answers now, whatever the caller sent
			plan := wire.Reclaim(&res)
			p.Plan = &plan
		}
	}
	return p
}

func writeProblem(w http.ResponseWriter, p Problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.retryAfter)) // whole seconds (RFC 9110 10.2.3)
	}
	if p.Status == http.StatusServiceUnavailable && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1") // throttling, or a refused connection, clears in about a second
	}
	if p.Status == http.StatusUnauthorized && h.Get("WWW-Authenticate") == "" {
		h.Set("WWW-Authenticate", `Bearer realm="openrelay"`)
	}
	if p.Plan != nil && p.Plan.PlanETag != "" {
		h.Set("ETag", p.Plan.PlanETag) // the new plan's, for the next If-Match
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
