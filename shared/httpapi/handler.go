// Package httpapi is the public HTTP API: routing, strict decoding, authentication, and the
// one mapping from domain error codes to HTTP statuses and RFC 9457 problem bodies.
package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/routes"
)

// Service is the domain the API exposes.
type Service interface {
	Reclaim(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error)
	PlanReclaim(ctx context.Context, p capacity.Principal, req capacity.ReclaimPlanRequest, meta capacity.RequestMeta) (*capacity.ReclaimPlan, error)
	Release(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, meta capacity.RequestMeta) (*capacity.CapacityResult, error)
	Place(ctx context.Context, p capacity.Principal, req capacity.PlacementRequest, meta capacity.RequestMeta) (*capacity.PlacementResult, error)
	GetReservation(ctx context.Context, p capacity.Principal, nodeID, reservationID string) (*capacity.Reservation, error)
	GetOperation(ctx context.Context, p capacity.Principal, nodeID, reservationID, opID string) (*capacity.OperationView, error)
	Redrive(ctx context.Context, p capacity.Principal, nodeID, reservationID, opID string, meta capacity.RequestMeta) (*capacity.RedriveResult, error)
	ScheduleReclaim(ctx context.Context, p capacity.Principal, req capacity.CapacityRequest, at time.Time, meta capacity.RequestMeta) (*capacity.ScheduleResult, error)
	GetScheduledReclaim(ctx context.Context, p capacity.Principal, nodeID, reservationID, id string) (*capacity.ScheduledReclaim, error)
	ListScheduledReclaims(ctx context.Context, p capacity.Principal, nodeID, reservationID string, page capacity.PageRequest) (*capacity.ScheduledPage, error)
	CancelScheduledReclaim(ctx context.Context, p capacity.Principal, nodeID, reservationID, id string, meta capacity.RequestMeta) (*capacity.ScheduledReclaim, error)

	// Operator routes: nodes, reservations and topology.
	PutNode(ctx context.Context, p capacity.Principal, req capacity.NodeRequest, meta capacity.RequestMeta) (*capacity.NodeResult, error)
	GetNode(ctx context.Context, p capacity.Principal, nodeID string) (*capacity.Node, error)
	CreateReservation(ctx context.Context, p capacity.Principal, req capacity.ReservationRequest, meta capacity.RequestMeta) (*capacity.ReservationResult, error)
	CancelReservation(ctx context.Context, p capacity.Principal, req capacity.ReservationChange, meta capacity.RequestMeta) (*capacity.ReservationResult, error)
	ReaffirmReservation(ctx context.Context, p capacity.Principal, req capacity.ReservationChange, meta capacity.RequestMeta) (*capacity.ReservationResult, error)
	ForceEnd(ctx context.Context, p capacity.Principal, req capacity.ForceEndRequest, meta capacity.RequestMeta) (*capacity.ForceEndResult, error)
	SetTopology(ctx context.Context, p capacity.Principal, req capacity.TopologyRequest, meta capacity.RequestMeta) (*capacity.TopologyResult, error)
	RotateAgentKey(ctx context.Context, p capacity.Principal, req capacity.AgentKeyRotation, meta capacity.RequestMeta) (*capacity.AgentKeyResult, error)
	EndAgentKeyOverlap(ctx context.Context, p capacity.Principal, req capacity.AgentKeyRotation, meta capacity.RequestMeta) (*capacity.AgentKeyResult, error)
	ListReservations(ctx context.Context, p capacity.Principal, nodeID string, page capacity.PageRequest) (*capacity.ReservationPage, error)

	// The node view.
	ListNodes(ctx context.Context, p capacity.Principal, page capacity.PageRequest) (*capacity.NodePage, error)
	GetNodeUnits(ctx context.Context, p capacity.Principal, nodeID string) (*capacity.NodeUnits, error)
	ListReclaimOperations(ctx context.Context, p capacity.Principal, nodeID, reservationID, state string, page capacity.PageRequest) (*capacity.OperationPage, error)

	// API keys.
	CreateKey(ctx context.Context, p capacity.Principal, req capacity.KeyRequest, meta capacity.RequestMeta) (*capacity.KeyResult, error)
	ListKeys(ctx context.Context, p capacity.Principal, page capacity.PageRequest) (*capacity.KeyPage, error)
	GetKey(ctx context.Context, p capacity.Principal, keyID string) (*capacity.APIKey, error)
	RevokeKey(ctx context.Context, p capacity.Principal, req capacity.KeyRevocation, meta capacity.RequestMeta) (*capacity.APIKey, error)
	SelfKey(ctx context.Context, p capacity.Principal) (*capacity.CallerKey, error)

	// Audit trail.
	ListReservationAudit(ctx context.Context, p capacity.Principal, nodeID, reservationID string, chain capacity.NodeChain, page capacity.PageRequest) (*capacity.AuditPage, error)
	ListNodeAudit(ctx context.Context, p capacity.Principal, nodeID string, chain capacity.NodeChain, page capacity.PageRequest) (*capacity.AuditChainPage, error)
	ListKeyAudit(ctx context.Context, p capacity.Principal, page capacity.PageRequest) (*capacity.AuditChainPage, error)
}

// Limiter admits or refuses an authenticated call by its key's rate (capacity.RateLimiter):
// an *Error CodeRateLimited, with RetryAfter, refuses it. Begin answers at once what needs no
// write (a refusal; take nil: admitted); otherwise take is the write that answers, which the
// handler runs first or, on the routes of overlapsLimit, beside the call's read.
type Limiter interface {
	Begin(ctx context.Context, p capacity.Principal) (take func() error, err error)
}

// Authenticator resolves an Authorization header to a principal.
type Authenticator interface {
	Authenticate(ctx context.Context, header string) (capacity.Principal, error)
	// AuthenticateFresh is Authenticate with the key read past any cache (the routes of
	// grantsAccess).
	AuthenticateFresh(ctx context.Context, header string) (capacity.Principal, error)
}

// Handler serves the API.
type Handler struct {
	Service Service
	Auth    Authenticator
	// Limit, if set, admits each authenticated call before its handler writes anything: a
	// key over its rate limit is answered 429 rate_limited with Retry-After. On the routes
	// of overlapsLimit it runs beside the call's decision read; on the others, first.
	Limit  Limiter
	Logger *slog.Logger
	// RequestID returns the id of the request (e.g. API Gateway's); default: X-Request-Id or
	// a new random id.
	RequestID func(*http.Request) string
	// BasePath returns the path the API is served under, before its routes (API Gateway's
	// stage, "/prod"); problem type URIs are built on it. Default: "" (the API at the host's
	// root).
	BasePath func(*http.Request) string
}

// route is one path and the handler of each method it accepts. Routes are matched by path
// first so that a wrong method gets a 405 problem, not the mux's plain-text one.
type route struct {
	pattern string
	methods map[string]boundHandler
}

// boundHandler is the handler of one route of routes.All.
type boundHandler struct {
	fn   handlerFunc
	auth bool // authenticate before calling fn; otherwise fn gets the zero principal
	// overlap: run the rate limiter beside fn's decision read (see overlapsLimit).
	overlap bool
	// fresh: authenticate past the key cache (see grantsAccess).
	fresh bool
}

// overlapsLimit are the operations whose rate limiter runs beside the call's decision read
// rather than before it, so that the limiter's write adds nothing to the call's time: the
// capacity calls, whose service waits for the limiter's answer (capacity.Admitted) after each
// read and before anything else, in its read-decide-commit rounds (every write of theirs is
// in one). A refused call reads its node and discards the read; it writes nothing.
var overlapsLimit = map[string]bool{"reclaim": true, "release": true, "placeVM": true}

// grantsAccess are the operations that hand out a secret that outlives the call: a new API
// key, and an agent key (a node's registration or owner change, a rotation). They read the
// caller's key past the key cache, so a key revoked or expired a moment ago is refused 401
// here at once, rather than within KEY_CACHE_TTL as on the other routes.
var grantsAccess = map[string]bool{"createKey": true, "putNode": true, "rotateAgentKey": true}

// handlerFunc serves a request, authenticated if its route requires it.
type handlerFunc func(w http.ResponseWriter, r *http.Request, p capacity.Principal, requestID string) error

// handlers binds each operationId of routes.All to its handler.
func (h *Handler) handlers() map[string]handlerFunc {
	return map[string]handlerFunc{
		"getOpenAPI":             h.serveOpenAPI,
		"getReservation":         h.getReservation,
		"reclaim":                h.capacity(ActionReclaim),
		"planReclaim":            h.planReclaim,
		"release":                h.capacity(ActionRelease),
		"getReclaimOperation":    h.getOperation,
		"retryReclaimOperation":  h.redrive,
		"getScheduledReclaim":    h.getScheduledReclaim,
		"listScheduledReclaims":  h.listScheduledReclaims,
		"cancelScheduledReclaim": h.cancelScheduledReclaim,
		"placeVM":                h.place,
		"putNode":                h.putNode,
		"getNode":                h.getNode,
		"setTopology":            h.setTopology,
		"rotateAgentKey":         h.rotateAgentKey,
		"endAgentKeyOverlap":     h.endAgentKeyOverlap,
		"listNodeAudit":          h.listNodeAudit,
		"listReservations":       h.listReservations,
		"createReservation":      h.createReservation,
		"cancelReservation":      h.changeReservation(capacity.ActionReservationCancel, "cancelReservation"),
		"reaffirmReservation":    h.changeReservation(capacity.ActionReservationReaffirm, "reaffirmReservation"),
		"listReservationAudit":   h.listReservationAudit,
		"listNodes":              h.listNodes,
		"getNodeUnits":           h.getNodeUnits,
		"listReclaimOperations":  h.listReclaimOperations,
		"forceEndVM":             h.forceEnd,
		"createKey":              h.createKey,
		"listKeys":               h.listKeys,
		"getKey":                 h.getKey,
		"revokeKey":              h.revokeKey,
		"listKeyAudit":           h.listKeyAudit,
		"getSelfKey":             h.getSelfKey,
	}
}

// bindRoutes groups the route table by path with each operation's handler. Every route needs
// a handler and every handler a route: the table is the one list of what the API serves.
func bindRoutes(table []routes.Route, fns map[string]handlerFunc) ([]route, error) {
	byPath := map[string]int{}
	var out []route
	used := map[string]bool{}
	for _, rt := range table {
		fn, ok := fns[rt.OperationID]
		if !ok {
			return nil, fmt.Errorf("route %s %s: no handler for operation %q", rt.Method, rt.Path, rt.OperationID)
		}
		used[rt.OperationID] = true
		i, ok := byPath[rt.Path]
		if !ok {
			i = len(out)
			byPath[rt.Path] = i
			out = append(out, route{pattern: rt.Path, methods: map[string]boundHandler{}})
		}
		out[i].methods[rt.Method] = boundHandler{fn: fn, auth: rt.Auth, overlap: overlapsLimit[rt.OperationID], fresh: grantsAccess[rt.OperationID]}
	}
	for op := range fns {
		if !used[op] {
			return nil, fmt.Errorf("handler %q: no route in the table", op)
		}
	}
	return out, nil
}

// Mux returns the routed API, built from routes.All.
func (h *Handler) Mux() http.Handler {
	bound, err := bindRoutes(routes.All, h.handlers())
	if err != nil {
		panic(err) // a programming error, caught by TestEveryRouteHasAHandler
	}
	mux := http.NewServeMux()
	for _, rt := range bound {
		mux.Handle(rt.pattern, h.serve(rt))
	}
	notFound := h.serve(route{})
	mux.Handle("/", notFound)
	return literalPaths(mux, notFound)
}

// literalPaths routes every path as sent. http.ServeMux answers a path that is not clean
// (a "." or ".." segment, an empty one) with a 307 redirect to the cleaned path: a path id
// of ".." would send the caller to another resource (the node instead of the reservation),
// and through API Gateway to a URL without the stage. Here a "." or ".." segment is routed
// as an ordinary segment (escaped, so the mux leaves it alone): as an id it names nothing
// and gets the route's 404, as anything else it matches no route. A path still not clean
// after that (an empty segment: no id is empty) gets the 404 of no route.
func literalPaths(mux *http.ServeMux, notFound http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		escaped := r.URL.EscapedPath()
		if isClean(escaped) {
			mux.ServeHTTP(w, r)
			return
		}
		segs := strings.Split(escaped, "/")
		for i, s := range segs {
			switch s {
			case ".":
				segs[i] = "%2E"
			case "..":
				segs[i] = "%2E%2E"
			}
		}
		escaped = strings.Join(segs, "/")
		if !isClean(escaped) {
			notFound.ServeHTTP(w, r)
			return
		}
		r2 := *r
		u := *r.URL
		u.RawPath = escaped // decodes to u.Path, which keeps the dots
		r2.URL = &u
		mux.ServeHTTP(w, &r2)
	})
}

// isClean reports whether the mux routes the escaped path as it is, without redirecting:
// the mux's own cleaning (net/http cleanPath) leaves it unchanged.
func isClean(escaped string) bool {
	if escaped == "" || escaped[0] != '/' {
		return false
	}
	c := path.Clean(escaped)
	if escaped[len(escaped)-1] == '/' && c != "/" {
		c += "/"
	}
	return c == escaped
}

// serve wraps a route with the request id, method check, authentication, problem rendering,
// the call's timing (Server-Timing, see statusRecorder) and one structured log line per request.
func (h *Handler) serve(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		reqID := h.requestID(r)
		w.Header().Set("X-Request-Id", reqID)
		ctx, stats := capacity.WithCallStats(r.Context())
		r = r.WithContext(ctx)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK, stats: stats, start: start}
		p, err := h.dispatch(rec, r, rt, reqID)
		if err != nil {
			prob := problemOf(err, h.apiBaseURL(r))
			writeProblem(rec, prob)
			if prob.Status >= 500 {
				h.logger().ErrorContext(r.Context(), "request failed", "request_id", reqID, "err", err)
			}
		}
		attrs := []any{"request_id", reqID, "method", r.Method, "route", rt.pattern, "path", r.URL.Path,
			"status", rec.status, "org", p.OrgID, "key_id", p.KeyID, "duration_ms", time.Since(start).Milliseconds()}
		attrs = append(attrs, timingAttrs(stats.Snapshot())...)
		if err != nil {
			attrs = append(attrs, "code", capacity.ErrorCode(err))
		}
		h.logger().InfoContext(r.Context(), "request", attrs...)
	})
}

func (h *Handler) dispatch(w *statusRecorder, r *http.Request, rt route, reqID string) (capacity.Principal, error) {
	if rt.methods == nil {
		return capacity.Principal{}, capacity.Errorf(capacity.CodeNotFound, "no such resource")
	}
	bh, ok := rt.methods[r.Method]
	if !ok {
		allowed := make([]string, 0, len(rt.methods))
		for m := range rt.methods {
			allowed = append(allowed, m)
		}
		sort.Strings(allowed)
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		return capacity.Principal{}, capacity.Errorf(CodeMethodNotAllowed, "%s is not allowed here; allowed: %s", r.Method, strings.Join(allowed, ", "))
	}
	if !bh.auth {
		return capacity.Principal{}, bh.fn(w, r, capacity.Principal{}, reqID)
	}
	if len(r.Header.Values("Authorization")) > 1 {
		// Which one would count is anyone's guess (a proxy may check one, we another).
		return capacity.Principal{}, capacity.Errorf(capacity.CodeUnauthenticated, "send one Authorization header")
	}
	authStart := time.Now()
	authenticate := h.Auth.Authenticate
	if bh.fresh {
		authenticate = h.Auth.AuthenticateFresh
	}
	p, err := authenticate(r.Context(), r.Header.Get("Authorization"))
	w.stats.Since(capacity.PhaseAuth, authStart)
	if err != nil {
		// RFC 6750 3.1: name the error only when credentials were presented.
		if capacity.ErrorCode(err) == capacity.CodeUnauthenticated && r.Header.Get("Authorization") != "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="openrelay", error="invalid_token"`)
		}
		return p, err
	}
	w.counts = p.Operator
	if h.Limit == nil {
		return p, bh.fn(w, r, p, reqID)
	}
	limitStart := time.Now()
	take, err := h.Limit.Begin(r.Context(), p)
	if err != nil || take == nil {
		// Known without a write: a refusal reads nothing, even on the overlapping routes.
		w.stats.Since(capacity.PhaseLimit, limitStart)
		if err != nil {
			return p, err
		}
		return p, bh.fn(w, r, p, reqID)
	}
	admit := func() error {
		defer w.stats.Since(capacity.PhaseLimit, limitStart)
		return take()
	}
	if !bh.overlap {
		if err := admit(); err != nil {
			return p, err
		}
		return p, bh.fn(w, r, p, reqID)
	}
	a := capacity.StartAdmission(admit)
	err = bh.fn(w, r.WithContext(capacity.WithAdmission(r.Context(), a)), p, reqID)
	// A refusal is the answer, whatever fn found: an invalid body or a missing node is
	// answered 429 as it was when the limiter came first. fn answered only after the
	// service waited for the limiter, so a success here was admitted.
	if aerr := a.Wait(); aerr != nil {
		if w.wrote {
			h.logger().ErrorContext(r.Context(), "answered before the rate limiter refused the call", "request_id", reqID, "status", w.status)
			return p, nil
		}
		return p, aerr
	}
	return p, err
}

func (h *Handler) requestID(r *http.Request) string {
	if h.RequestID != nil {
		if id := h.RequestID(r); id != "" {
			return id
		}
	}
	// A caller's own id is taken only if it is printable ASCII: it is echoed in a header and
	// recorded in logs and audit records, where a control character could forge lines.
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 && !strings.ContainsFunc(id, func(c rune) bool { return c <= ' ' || c > '~' }) {
		return id
	}
	return capacity.NewID()
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}
