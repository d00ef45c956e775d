// Package client is a Go client of the capacity API: one method per route, answers decoded
// into the shared/wire types the API itself answers with, and problems (RFC 9457) as *Error.
// capacityctl and the end-to-end tests use it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/openrelay/capacity/shared/wire"
)

// maxAnswer bounds what the client reads of one answer (the API's largest pages are far below).
const maxAnswer = 16 << 20

// Client calls the API at Endpoint with Key.
type Client struct {
	// Endpoint is the API's base URL, e.g. the stack output ApiUrl
	// ("https://abc.execute-api.eu-west-1.amazonaws.com/dev/").
	Endpoint string
	// Key is the API key sent as a bearer token ("" sends none).
	Key string
	// HTTP sends the requests; nil uses a client with a 30-second timeout.
	HTTP *http.Client
}

// New returns a client of the API at endpoint. hc may be nil.
func New(endpoint, key string, hc *http.Client) *Client {
	return &Client{Endpoint: endpoint, Key: key, HTTP: hc}
}

var defaultHTTP = &http.Client{Timeout: 30 * time.Second}

// Options are the optional headers of a write.
type Options struct {
	// IdempotencyKey makes a retried write safe: the API replays its first answer.
	IdempotencyKey string
	// IfMatch (reclaims only) runs the reclaim only if its plan still has this ETag.
	IfMatch string
}

// Meta is what an answer says besides its body.
type Meta struct {
	Status    int
	ETag      string // dry-run reclaims: the plan's ETag
	Location  string // 201 answers: the new resource
	RequestID string // X-Request-Id, for the operator's logs
	Replayed  bool   // Idempotent-Replayed: the answer of an earlier call with the same key
	Body      []byte // the answer as sent
}

// Error is a problem answer: a status with a machine code. errors.As it out of any method.
type Error struct {
	Status  int
	Code    string
	Detail  string
	UnitIDs []string
	// Plan is the new plan of a 412 plan_changed (a dry-run answer with its planEtag).
	Plan *wire.ReservationJSON
	// ETag is the header of the answer (412: the new plan's ETag).
	ETag      string
	RequestID string
	// Hint says what to check when the answer alone does not (API Gateway's own errors).
	Hint string
	// Body is the answer as sent.
	Body []byte
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%d %s", e.Status, e.Code)
	if e.Code == "" {
		msg = fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if len(e.UnitIDs) > 0 {
		msg += " (units " + strings.Join(e.UnitIDs, ", ") + ")"
	}
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return msg
}

// FromGateway reports whether the answer is API Gateway's own (429, 502, 503, 504 without a
// problem code): the request may never have reached the service, or its answer was lost.
func (e *Error) FromGateway() bool {
	switch e.Status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return e.Code == ""
	}
	return false
}

// IsCode reports whether err is a problem answer with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// problem is the problem body; plan only on plan_changed.
type problem struct {
	Status  int                   `json:"status"`
	Detail  string                `json:"detail"`
	Code    string                `json:"code"`
	UnitIDs []string              `json:"unitIds"`
	Plan    *wire.ReservationJSON `json:"plan"`
	// Message is what API Gateway's own errors carry instead ({"message":"..."}).
	Message string `json:"message"`
}

// do sends one request and decodes a 2xx answer's body into out (nil: ignore it).
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body any, opt Options, out any) (*Meta, error) {
	if c.Endpoint == "" {
		return nil, errors.New("no API endpoint")
	}
	if c.Key != "" {
		if err := CheckEndpoint(c.Endpoint); err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	u := strings.TrimSuffix(c.Endpoint, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s body: %w", method, path, err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Key != "" {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	if opt.IdempotencyKey != "" {
		req.Header.Set("Idempotency-Key", opt.IdempotencyKey)
	}
	if opt.IfMatch != "" {
		req.Header.Set("If-Match", opt.IfMatch)
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	meta := &Meta{
		Status: resp.StatusCode, ETag: resp.Header.Get("ETag"), Location: resp.Header.Get("Location"),
		RequestID: resp.Header.Get("X-Request-Id"), Replayed: resp.Header.Get("Idempotent-Replayed") == "true", Body: raw,
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return meta, problemError(meta, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return meta, fmt.Errorf("%s %s: decode %d answer: %w", method, path, resp.StatusCode, err)
		}
	}
	return meta, nil
}

// problemError makes an *Error of a non-2xx answer, whatever its body (API Gateway's own
// errors are not problem documents).
func problemError(meta *Meta, raw []byte) *Error {
	e := &Error{Status: meta.Status, ETag: meta.ETag, RequestID: meta.RequestID, Body: raw}
	var p problem
	s := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &p) == nil {
		e.Code, e.Detail, e.UnitIDs, e.Plan = p.Code, p.Detail, p.UnitIDs, p.Plan
		if e.Code == "" && e.Detail == "" {
			e.Detail = p.Message
			if e.Detail == "" && s != "{}" && s != "null" {
				e.Detail = truncate(s, 200)
			}
		}
	} else if s != "" {
		e.Detail = truncate(s, 200)
	}
	// API Gateway answers 403 "Missing Authentication Token" for a path it has no route for,
	// which is nearly always a wrong URL or stage rather than a missing key.
	if e.Status == http.StatusForbidden && e.Code == "" && p.Message == "Missing Authentication Token" {
		e.Hint = "API Gateway has no such route: check the endpoint URL and its stage, e.g. https://<api>.execute-api.<region>.amazonaws.com/<stage>/"
	}
	return e
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// esc escapes one path segment.
func esc(s string) string { return url.PathEscape(s) }

func reservationPath(node, res string) string {
	return "/v1/nodes/" + esc(node) + "/reservations/" + esc(res)
}

// Page asks for one page of a list.
type Page struct {
	Limit  int    // 0: the API's default
	Cursor string // "": the first page
}

func (p Page) query() url.Values {
	q := url.Values{}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	}
	return q
}

// ReclaimRequest is the body of a reclaim (and of its dry run).
type ReclaimRequest struct {
	UnitIDs      []string `json:"unitIds"`
	DryRun       bool     `json:"dryRun,omitempty"`
	Reason       string   `json:"reason,omitempty"`
	GraceSeconds int      `json:"graceSeconds,omitempty"`
}

// Reclaim reclaims units of a reservation (a dry run when req.DryRun). A dry run's Meta.ETag
// is the plan's ETag; pass it as opt.IfMatch to the real call.
func (c *Client) Reclaim(ctx context.Context, node, res string, req ReclaimRequest, opt Options) (*wire.ReservationJSON, *Meta, error) {
	var out wire.ReservationJSON
	meta, err := c.do(ctx, http.MethodPost, reservationPath(node, res)+"/reclaim", nil, req, opt, &out)
	if err != nil {
		return nil, meta, err
	}
	return &out, meta, nil
}

// ReclaimPlanRequest is the body of a reclaim plan: how many units, and the reason and grace
// of the reclaim it plans (both part of the plan's ETag: send the same with the reclaim).
type ReclaimPlanRequest struct {
	Count        int    `json:"count"`
	Reason       string `json:"reason,omitempty"`
	GraceSeconds int    `json:"graceSeconds,omitempty"`
}

// PlanReclaim asks which units a reclaim of req.Count units should take; it changes nothing.
// Reclaim the answer's UnitIDs with Meta.ETag as opt.IfMatch to carry out exactly that plan.
func (c *Client) PlanReclaim(ctx context.Context, node, res string, req ReclaimPlanRequest) (*wire.ReclaimPlanJSON, *Meta, error) {
	var out wire.ReclaimPlanJSON
	meta, err := c.do(ctx, http.MethodPost, reservationPath(node, res)+"/reclaim-plan", nil, req, Options{}, &out)
	if err != nil {
		return nil, meta, err
	}
	return &out, meta, nil
}

// GetReservation reads a reservation.
func (c *Client) GetReservation(ctx context.Context, node, res string) (*wire.ReservationJSON, *Meta, error) {
	var out wire.ReservationJSON
	meta, err := c.do(ctx, http.MethodGet, reservationPath(node, res), nil, nil, Options{}, &out)
	if err != nil {
		return nil, meta, err
	}
	return &out, meta, nil
}

// GetReclaim reads a reclaim operation: the termination of the VMs a reclaim evicted.
func (c *Client) GetReclaim(ctx context.Context, node, res, reclaimID string) (*wire.OperationJSON, *Meta, error) {
	var out wire.OperationJSON
	meta, err := c.do(ctx, http.MethodGet, reservationPath(node, res)+"/reclaims/"+esc(reclaimID), nil, nil, Options{}, &out)
	if err != nil {
		return nil, meta, err
	}
	return &out, meta, nil
}

// PlaceRequest is the body of a VM placement.
type PlaceRequest struct {
	VMID    string   `json:"vmId"`
	OrgID   string   `json:"orgId"`
	Tier    string   `json:"tier"`
	UnitIDs []string `json:"unitIds"`
}

// PlaceVM records a placement (operator with vm.place: the marketplace scheduler).
func (c *Client) PlaceVM(ctx context.Context, node string, req PlaceRequest, opt Options) (*wire.VMJSON, *Meta, error) {
	var out wire.VMJSON
	meta, err := c.do(ctx, http.MethodPost, "/v1/nodes/"+esc(node)+"/vms", nil, req, opt, &out)
	if err != nil {
		return nil, meta, err
	}
	return &out, meta, nil
}

// ReleaseRequest is the body of a release.
type ReleaseRequest struct {
	UnitIDs []string `json:"unitIds"`
	Reason  string   `json:"reason,omitempty"`
}

// Release puts idle exclusive units of a reservation on the spot market.
func (c *Client) Release(ctx context.Context, node, res string, req ReleaseRequest, opt Options) (*wire.ReservationJSON, *Meta, error) {
	return call[wire.ReservationJSON](ctx, c, http.MethodPost, reservationPath(node, res)+"/release", nil, req, opt)
}
