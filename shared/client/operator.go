package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/openrelay/capacity/shared/wire"
)

// The operator routes (nodes, reservations, topology, keys) and the audit trail. Request
// bodies leave out what is not set: the API refuses null, and an absent member takes its
// default.

// NodeRequest is the body of PUT /v1/nodes/{nodeId}.
type NodeRequest struct {
	OwnerOrgID    string   `json:"ownerOrgId"`
	UnitIDs       []string `json:"unitIds"`
	AgentEndpoint string   `json:"agentEndpoint"`
	Reason        string   `json:"reason,omitempty"`
}

func nodePath(node string) string { return "/v1/nodes/" + esc(node) }

// PutNode registers (201, with the agent key once) or updates (200) a node.
func (c *Client) PutNode(ctx context.Context, node string, req NodeRequest, opt Options) (*wire.NodeAnswerJSON, *Meta, error) {
	return call[wire.NodeAnswerJSON](ctx, c, http.MethodPut, nodePath(node), nil, req, opt)
}

// RotateAgentKey gives the node's agent a new key, answered once; the previous one works
// until the answer's previousValidUntil.
func (c *Client) RotateAgentKey(ctx context.Context, node, reason string, opt Options) (*wire.AgentKeyAnswerJSON, *Meta, error) {
	return call[wire.AgentKeyAnswerJSON](ctx, c, http.MethodPost, nodePath(node)+"/agent-key/rotate", nil, reasonBody{reason}, opt)
}

// EndAgentKeyOverlap ends the overlap of the node's current agent key now: the previous key
// is never used again (after a leak of it).
func (c *Client) EndAgentKeyOverlap(ctx context.Context, node, reason string, opt Options) (*wire.AgentKeyAnswerJSON, *Meta, error) {
	return call[wire.AgentKeyAnswerJSON](ctx, c, http.MethodPost, nodePath(node)+"/agent-key/end-overlap", nil, reasonBody{reason}, opt)
}

// GetNode reads a node.
func (c *Client) GetNode(ctx context.Context, node string) (*wire.NodeGetJSON, *Meta, error) {
	return call[wire.NodeGetJSON](ctx, c, http.MethodGet, nodePath(node), nil, nil, Options{})
}

// TopologyRequest is the body of PUT /v1/nodes/{nodeId}/topology.
type TopologyRequest struct {
	UnitIDs []string `json:"unitIds"`
	Reason  string   `json:"reason,omitempty"`
	// ExpectedTopologyGen, when not 0, is the node's topologyGen the change was made
	// against: a node at another one refuses it (409 topology_changed).
	ExpectedTopologyGen int64 `json:"expectedTopologyGen,omitempty"`
}

// SetTopology sets a node's unit list; its reservations move to needs-review.
func (c *Client) SetTopology(ctx context.Context, node string, req TopologyRequest, opt Options) (*wire.TopologyJSON, *Meta, error) {
	return call[wire.TopologyJSON](ctx, c, http.MethodPut, nodePath(node)+"/topology", nil, req, opt)
}

// ReservationRequest is the body of POST /v1/nodes/{nodeId}/reservations. Times are RFC 3339.
type ReservationRequest struct {
	ID              string   `json:"id,omitempty"`
	Status          string   `json:"status,omitempty"`
	StartsAt        string   `json:"startsAt"`
	EndsAt          string   `json:"endsAt,omitempty"`
	AllowedOrgIDs   []string `json:"allowedOrgIds"`
	ManagingOrgIDs  []string `json:"managingOrgIds"`
	ReservedUnitIDs []string `json:"reservedUnitIds"`
	ContractRef     string   `json:"contractRef,omitempty"`
	Reason          string   `json:"reason,omitempty"`
}

// CreateReservation creates a reservation (201, Meta.Location names it).
func (c *Client) CreateReservation(ctx context.Context, node string, req ReservationRequest, opt Options) (*wire.ReservationAnswerJSON, *Meta, error) {
	return call[wire.ReservationAnswerJSON](ctx, c, http.MethodPost, nodePath(node)+"/reservations", nil, req, opt)
}

// ListReservations reads one page of a node's reservations.
func (c *Client) ListReservations(ctx context.Context, node string, page Page) (*wire.ReservationPageJSON, *Meta, error) {
	return call[wire.ReservationPageJSON](ctx, c, http.MethodGet, nodePath(node)+"/reservations", page.query(), nil, Options{})
}

// reasonBody is the body of cancel, reaffirm and revoke.
type reasonBody struct {
	Reason string `json:"reason,omitempty"`
}

// CancelReservation cancels a reservation; it terminates nothing and lists the VMs on its units.
func (c *Client) CancelReservation(ctx context.Context, node, res, reason string, opt Options) (*wire.ReservationAnswerJSON, *Meta, error) {
	return call[wire.ReservationAnswerJSON](ctx, c, http.MethodPost, reservationPath(node, res)+"/cancel", nil, reasonBody{reason}, opt)
}

// ReaffirmReservation moves a needs-review reservation back to active at the node's topology.
func (c *Client) ReaffirmReservation(ctx context.Context, node, res, reason string, opt Options) (*wire.ReservationAnswerJSON, *Meta, error) {
	return call[wire.ReservationAnswerJSON](ctx, c, http.MethodPost, reservationPath(node, res)+"/reaffirm", nil, reasonBody{reason}, opt)
}

// ListReservationAudit reads one page of a reservation's audit records, newest first: chain
// "changes" (or "": the service's default) its changes, "calls" the calls about it that
// changed nothing.
func (c *Client) ListReservationAudit(ctx context.Context, node, res, chain string, page Page) (*wire.AuditPageJSON, *Meta, error) {
	return call[wire.AuditPageJSON](ctx, c, http.MethodGet, reservationPath(node, res)+"/audit", chainQuery(page, chain), nil, Options{})
}

// chainQuery is a page's query with the chain named, if one is.
func chainQuery(page Page, chain string) url.Values {
	q := page.query()
	if chain != "" {
		q.Set("chain", chain)
	}
	return q
}

// ListScheduledReclaims reads one page of a reservation's scheduled reclaims, in order of at.
func (c *Client) ListScheduledReclaims(ctx context.Context, node, res string, page Page) (*wire.ScheduledPageJSON, *Meta, error) {
	return call[wire.ScheduledPageJSON](ctx, c, http.MethodGet, reservationPath(node, res)+"/scheduled-reclaims", page.query(), nil, Options{})
}

// ListNodeAudit reads one page of one of a node's audit chains ("changes", "calls"; "": the
// service's default, changes), in chain order.
func (c *Client) ListNodeAudit(ctx context.Context, node, chain string, page Page) (*wire.AuditChainPageJSON, *Meta, error) {
	return call[wire.AuditChainPageJSON](ctx, c, http.MethodGet, nodePath(node)+"/audit", chainQuery(page, chain), nil, Options{})
}

// ListKeyAudit reads one page of the key-management audit chain.
func (c *Client) ListKeyAudit(ctx context.Context, page Page) (*wire.AuditChainPageJSON, *Meta, error) {
	return call[wire.AuditChainPageJSON](ctx, c, http.MethodGet, "/v1/keys/audit", page.query(), nil, Options{})
}

// KeyRequest is the body of POST /v1/keys. ExpiresAt is RFC 3339.
type KeyRequest struct {
	OrgID       string   `json:"orgId"`
	Permissions []string `json:"permissions"`
	Operator    bool     `json:"operator,omitempty"`
	ExpiresAt   string   `json:"expiresAt,omitempty"`
	Description string   `json:"description,omitempty"`
	// RateLimit is the key's own rate limit (nil: the environment's).
	RateLimit *wire.RateLimitJSON `json:"rateLimit,omitempty"`
}

// CreateKey creates an API key; the answer holds its secret, once.
func (c *Client) CreateKey(ctx context.Context, req KeyRequest, opt Options) (*wire.KeyAnswerJSON, *Meta, error) {
	return call[wire.KeyAnswerJSON](ctx, c, http.MethodPost, "/v1/keys", nil, req, opt)
}

// ListKeys reads one page of API keys.
func (c *Client) ListKeys(ctx context.Context, page Page) (*wire.KeyPageJSON, *Meta, error) {
	return call[wire.KeyPageJSON](ctx, c, http.MethodGet, "/v1/keys", page.query(), nil, Options{})
}

// SelfKey reads the calling key itself: its org, permissions, expiry and own rate limit
// (GET /v1/keys/self; any key may).
func (c *Client) SelfKey(ctx context.Context) (*wire.SelfKeyJSON, *Meta, error) {
	return call[wire.SelfKeyJSON](ctx, c, http.MethodGet, "/v1/keys/self", nil, nil, Options{})
}

// RevokeKey revokes an API key (repeat-safe).
func (c *Client) RevokeKey(ctx context.Context, keyID, reason string, opt Options) (*wire.KeyGetJSON, *Meta, error) {
	return call[wire.KeyGetJSON](ctx, c, http.MethodPost, "/v1/keys/"+esc(keyID)+"/revoke", nil, reasonBody{reason}, opt)
}

// call sends one request and decodes its answer into a T.
func call[T any](ctx context.Context, c *Client, method, path string, query url.Values, body any, opt Options) (*T, *Meta, error) {
	var out T
	meta, err := c.do(ctx, method, path, query, body, opt, &out)
	if err != nil {
		return nil, meta, err
	}
	return &out, meta, nil
}

// ListNodes reads one page of the nodes the caller may see, in id order.
func (c *Client) ListNodes(ctx context.Context, page Page) (*wire.NodePageJSON, *Meta, error) {
	return call[wire.NodePageJSON](ctx, c, http.MethodGet, "/v1/nodes", page.query(), nil, Options{})
}

// GetNodeUnits reads a node's unit view: each unit's state, reservation and VM as far as the
// caller may see them.
func (c *Client) GetNodeUnits(ctx context.Context, node string) (*wire.NodeUnitsJSON, *Meta, error) {
	return call[wire.NodeUnitsJSON](ctx, c, http.MethodGet, nodePath(node)+"/units", nil, nil, Options{})
}

// ListReclaims reads one page of a reservation's reclaim operations, newest first; state
// ("in-flight", "failed", "completed"; "": any) filters them.
func (c *Client) ListReclaims(ctx context.Context, node, res, state string, page Page) (*wire.ReclaimPageJSON, *Meta, error) {
	q := page.query()
	if state != "" {
		q.Set("state", state)
	}
	return call[wire.ReclaimPageJSON](ctx, c, http.MethodGet, reservationPath(node, res)+"/reclaims", q, nil, Options{})
}
