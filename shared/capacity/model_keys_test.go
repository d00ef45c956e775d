package capacity_test

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
)

// mKeyTTL is the api's key cache window (KEY_CACHE_TTL's default): a revoked key may still
// authenticate this long after its revocation, in an instance that read it before, never
// longer.
const mKeyTTL = 30 * time.Second

// mKey is a key minted in the run.
type mKey struct {
	id, secret  string
	org         string
	permissions []string
	expires     *time.Time
	revokedAt   *time.Time
}

// mFetch is the authenticator's cached read of a key: when, and whether it was usable then.
type mFetch struct {
	at      time.Time
	revoked bool
}

// mKeys is the model's keys and one api instance's authenticator, with its cache.
type mKeys struct {
	auth    *auth.Authenticator
	minted  map[string]*mKey  // by key id
	fetched map[string]mFetch // by key id (or secret, for keys never minted)
}

func (m *model) keyModel() *mKeys {
	if m.keys == nil {
		m.keys = &mKeys{minted: map[string]*mKey{}, fetched: map[string]mFetch{},
			auth: &auth.Authenticator{Keys: m.store.Keys(), TTL: mKeyTTL, Now: func() time.Time { return m.clock }}}
	}
	return m.keys
}

func (m *model) drawMinted(t *rapid.T) *mKey {
	k := m.keyModel()
	ids := slices.Sorted(maps.Keys(k.minted))
	if len(ids) == 0 {
		return nil
	}
	return k.minted[rapid.SampledFrom(ids).Draw(t, "minted")]
}

// stepMintKey creates a key: an operator holding key.manage may, for any org, no more than
// it holds; anyone else gets the routes' 404.
func (m *model) stepMintKey(t *rapid.T) {
	k := m.keyModel()
	p := mOperator
	if chance(t, 15, "notKeyManager") {
		p = rapid.SampledFrom([]capacity.Principal{mManager, mPlacer}).Draw(t, "caller")
	}
	req := capacity.KeyRequest{OrgID: rapid.SampledFrom([]string{"mgr", "own-a", "aud"}).Draw(t, "org"),
		Permissions: rapid.SampledFrom([][]string{{capacity.PermCapacity}, {capacity.PermRead}}).Draw(t, "permissions")}
	if chance(t, 30, "expires") {
		req.ExpiresAt = ptr(m.clock.Add(rapid.SampledFrom([]time.Duration{time.Minute, time.Hour}).Draw(t, "expiresIn")))
	}
	m.step("mint key")
	what := fmt.Sprintf("mint %+v by %s", req, p.KeyID)
	res, err := m.svc.CreateKey(m.ctx, p, req, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if !p.CanOperate(capacity.PermKeyManage) {
		m.expectErr(what, err, capacity.CodeNotFound, nil)
		return
	}
	m.expectOK(what, err)
	if res.Secret == "" || res.Key.OrgID != req.OrgID || !same(res.Key.Permissions, req.Permissions) || k.minted[res.Key.KeyID] != nil {
		m.mismatch("%s: minted %+v", what, res.Key)
	}
	k.minted[res.Key.KeyID] = &mKey{id: res.Key.KeyID, secret: res.Secret, org: req.OrgID, permissions: req.Permissions, expires: req.ExpiresAt}
}

// stepRevokeMinted revokes a minted key (again, sometimes: nothing changes).
func (m *model) stepRevokeMinted(t *rapid.T) {
	mk := m.drawMinted(t)
	if mk == nil {
		return
	}
	m.step("revoke minted key")
	what := "revoke minted " + mk.id
	got, err := m.svc.RevokeKey(m.ctx, mOperator, capacity.KeyRevocation{KeyID: mk.id, Reason: "leaked"}, capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	m.expectOK(what, err)
	if !got.Revoked {
		m.mismatch("%s: answered a key not revoked", what)
	}
	if mk.revokedAt == nil {
		mk.revokedAt = ptr(m.clock)
	}
}

// stepUseKey presents a minted key (or one never minted) to the api's authenticator, a
// moment later: it answers as the key was when its cache last read it, for mKeyTTL. A
// revoked key never authenticates once the window after its revocation has passed, nor in an
// instance that read it revoked; a key never minted never does.
func (m *model) stepUseKey(t *rapid.T) {
	k := m.keyModel()
	if d := rapid.SampledFrom([]time.Duration{0, 10 * time.Second, 29 * time.Second, 31 * time.Second, 2 * time.Minute}).Draw(t, "later"); d > 0 {
		m.clock = m.clock.Add(d)
		for _, id := range mNodeIDs {
			m.touched[id] = true // time passed: every node's invariants hold at the new time
		}
	}
	mk := m.drawMinted(t)
	if mk == nil || chance(t, 10, "neverMinted") {
		secret, err := capacity.NewKeySecret()
		if err != nil {
			t.Fatal(err)
		}
		mk = &mKey{id: "never-minted", secret: secret}
	}
	m.step("use key")
	what := fmt.Sprintf("authenticate %s at %v (revoked at %v, cache %+v)", mk.id, m.clock, mk.revokedAt, k.fetched[mk.id])
	seen, ok := k.fetched[mk.id]
	if !ok || m.clock.Sub(seen.at) >= mKeyTTL {
		seen = mFetch{at: m.clock, revoked: mk.revokedAt != nil}
		k.fetched[mk.id] = seen
	}
	usable := mk.org != "" && !seen.revoked && (mk.expires == nil || m.clock.Before(*mk.expires))
	p, err := k.auth.Authenticate(m.ctx, "Bearer "+mk.secret)
	if err == nil && mk.revokedAt != nil && !m.clock.Before(mk.revokedAt.Add(mKeyTTL)) {
		m.violation("%s: a key revoked at %v authenticated past its cache window", what, *mk.revokedAt)
	}
	if !usable {
		m.expectErr(what, err, capacity.CodeUnauthenticated, nil)
		return
	}
	m.expectOK(what, err)
	if p.KeyID != mk.id || p.OrgID != mk.org || !same(p.Permissions, mk.permissions) || p.Operator {
		m.violation("%s: authenticated as %+v, not as the key minted", what, p)
	}
}

// stepRotate gives a node's agent a new key (operators holding node.manage only): the next
// generation, sealed in the node, the previous one kept for the overlap.
func (m *model) stepRotate(t *rapid.T) {
	node := rapid.SampledFrom(mNodeIDs).Draw(t, "node")
	m.touched[node] = true
	n := m.nodes[node]
	p := mOperator
	if chance(t, 15, "notOperator") {
		p = rapid.SampledFrom([]capacity.Principal{mOwnerA, mManager, mPlacer}).Draw(t, "caller")
	}
	m.step("rotate agent key")
	what := fmt.Sprintf("rotate the agent key of %s (gen %d) by %s", node, n.agentGen, p.KeyID)
	res, err := m.svc.RotateAgentKey(m.ctx, p, capacity.AgentKeyRotation{NodeID: node, Reason: "scheduled rotation"},
		capacity.RequestMeta{RequestID: m.newID("req-")})
	if m.transient(err) {
		return
	}
	if !p.CanOperate(capacity.PermNodeManage) {
		m.expectErr(what, err, capacity.CodeNotFound, nil)
		return
	}
	m.expectOK(what, err)
	if res.Gen != n.agentGen+1 || len(res.AgentKey) != capacity.AgentKeyBytes || !res.PreviousValidUntil.Equal(m.clock.Add(capacity.AgentKeyOverlap)) {
		m.mismatch("%s: answered gen %d, %d key bytes, previous valid until %v", what, res.Gen, len(res.AgentKey), res.PreviousValidUntil)
	}
	sealed := sealedFor(node, res.AgentKey)
	if bytes.Equal(sealed, n.sealed) || bytes.Equal(sealed, n.prevSealed) {
		m.violation("%s: the new key is a key the node had", what)
	}
	n.agentGen, n.prevSealed, n.sealed = res.Gen, n.sealed, sealed
	n.version++
}

// compareAgentKey checks the node's stored agent key generation against the model's.
func (m *model) compareAgentKey(id string, got capacity.Node) {
	n := m.nodes[id]
	if got.AgentKeyGen != n.agentGen || !bytes.Equal(got.AgentKey, n.sealed) || !bytes.Equal(got.PrevAgentKey, n.prevSealed) {
		m.mismatch("node %s: agent key gen %d (%q, previous %q), model %d (%q, previous %q)", id, got.AgentKeyGen, got.AgentKey,
			got.PrevAgentKey, n.agentGen, n.sealed, n.prevSealed)
	}
}
