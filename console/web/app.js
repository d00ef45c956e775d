// The capacity console: one page, views by the address's #fragment (never the key), drawn with
// preact + htm from our own origin. Every string from the API is shown as text: preact sets
// text and attributes, never HTML.
import { h, render } from './vendor/preact.mjs';
import htm from './vendor/htm.mjs';
import { call, path, getKey, setKey, forgetKey, Problem, newIdempotencyKey } from './api.js';
import { verifyRecords } from './audit.js';

const html = htm.bind(h);
const root = document.getElementById('app');
root.textContent = ''; // the no-script note

// The unit states of GET /v1/nodes/{nodeId}/units, each with its words and letter.
export const unitStates = {
  exclusive: { text: 'exclusive', letter: 'E', says: 'reserved, idle, not released' },
  released: { text: 'released, idle', letter: 'R', says: 'released to the spot market, no VM' },
  spot: { text: 'spot VM', letter: 'S', says: 'under a running spot VM' },
  terminating: { text: 'terminating', letter: 'T', says: 'under a VM being terminated' },
  occupied: { text: 'reserved/on-demand VM', letter: 'O', says: 'under a running reserved or on-demand VM' },
  unreserved: { text: 'unreserved', letter: 'U', says: 'in no reservation, idle' },
};

// S is the page's whole state; set() changes it and draws again.
const S = {
  route: [], signInError: '', loading: false, error: null,
  self: null, // the key signed in with (GET /v1/keys/self): what it may do
  nodes: null, nodeUnits: {}, // nodeId -> units answer
  node: null, selection: new Set(), reclaim: {}, // per reservation id: {reason, count, plan, etag, idem, result, problem}
  op: null, opTimer: null, now: Date.now(), graceEnds: {}, // reclaimId -> terminateAfter of the reclaim sent here
  reservation: null, keys: null, newSecret: null, registration: null, chain: null,
};
const set = (patch) => { Object.assign(S, patch); draw(); };

// can reports whether the signed-in key may use the operator routes of perm: an operator key
// holding it (docs/api.md "Permissions"). It decides what is offered; the API decides calls.
const can = (perm) => !!(S.self && S.self.operator && (S.self.permissions || []).includes(perm));

// An operation is in flight until it is completed or failed.
const inFlight = (state) => state === 'pending-start' || state === 'terminating';

// ---- routing ----

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  return parts.length ? parts : ['nodes'];
}
const href = (...segs) => '#/' + segs.map(encodeURIComponent).join('/');

async function go() {
  clearInterval(S.opTimer);
  S.opTimer = null;
  const route = parseRoute();
  set({ route, error: null, loading: true, newSecret: null });
  focusHeading();
  if (!getKey()) { set({ loading: false }); return; }
  try {
    const [a, b, c, d, e, f] = route;
    if (a === 'nodes' && !b) await loadNodes();
    else if (a === 'nodes' && b && !c) await loadNode(b);
    else if (a === 'nodes' && c === 'reservations' && e === 'reclaims' && f) await followOperation(b, d, f);
    else if (a === 'nodes' && c === 'reservations' && d) await loadReservation(b, d);
    else if (a === 'keys' && can('key.manage')) await loadKeys();
    else if (a === 'audit' && can('audit.read')) await loadChain(b);
    else if (a === 'register') { /* a form only */ }
    set({ loading: false });
  } catch (err) { fail(err); }
  focusHeading();
}

// focusHeading moves the focus to the new view's heading (screen readers announce it), unless
// the person has already moved it elsewhere (typing in a form while the view loads).
function focusHeading() {
  requestAnimationFrame(() => {
    const h1 = document.querySelector('main h1');
    const at = document.activeElement;
    if (h1 && (!at || at === document.body || at.tagName === 'H1' || at.tagName === 'A')) h1.focus({ preventScroll: true });
  });
}

// fail shows a call's problem; a 401 forgets the key and returns to sign-in with its detail.
function fail(err) {
  if (err instanceof Problem && err.status === 401) {
    forgetKey();
    set({ loading: false, signInError: err.body.detail || err.body.title || 'The key was refused.' });
    return;
  }
  set({ loading: false, error: err instanceof Problem ? err : { message: String(err.message || err), body: {} } });
}

// ---- loads ----

// loadNodes reads a page of nodes (more: the next page after those shown), then each listed
// node's units for its strip, all at once.
async function loadNodes(more) {
  const { data } = await call('GET', 'v1/nodes', { query: { limit: 50, cursor: more ? S.nodesCursor : undefined } });
  S.nodes = more ? [...(S.nodes || []), ...data.nodes] : data.nodes;
  S.nodesCursor = data.nextCursor;
  draw();
  await Promise.all(data.nodes.map(async (n) => {
    try { S.nodeUnits[n.nodeId] = (await call('GET', path('v1/nodes', n.nodeId, 'units'))).data; } catch (err) {
      if (err instanceof Problem && err.status === 401) throw err;
      S.nodeUnits[n.nodeId] = { error: err.message };
    }
    draw();
  }));
}

async function moreNodes() {
  try { await loadNodes(true); } catch (err) { fail(err); }
}

async function loadNode(nodeId) {
  const { data } = await call('GET', path('v1/nodes', nodeId, 'units'));
  if (!S.node || S.node.nodeId !== nodeId) { S.selection = new Set(); S.reclaim = {}; }
  S.node = data;
  S.nodeUnits[nodeId] = data;
}

async function loadReservation(nodeId, resId) {
  const base = path('v1/nodes', nodeId, 'reservations', resId);
  const [res, reclaims, scheduled, audit] = await Promise.all([
    call('GET', base),
    call('GET', base + '/reclaims', { query: { limit: 20 } }).catch(keep),
    call('GET', base + '/scheduled-reclaims', { query: { limit: 50 } }).catch(keep),
    call('GET', base + '/audit', { query: { limit: 50 } }).catch(keep),
  ]);
  const records = audit.data ? audit.data.records : [];
  S.reservation = {
    nodeId, resId, res: res.data, reclaims, scheduled, audit, records,
    verify: audit.data ? await verifyRecords(records) : null,
  };
}

// keep turns a refused read into its problem, shown in its place (an audience may read a
// reservation but not its audit); a 401 still signs out.
function keep(err) {
  if (err instanceof Problem && err.status === 401) throw err;
  return { problem: err };
}

async function loadKeys() {
  const { data } = await call('GET', 'v1/keys', { query: { limit: 100 } });
  S.keys = data.keys;
}

// loadSelf reads the signed-in key itself (any key may): what it may do decides what the page
// offers. Its 401 is the sign-in's refusal of a junk, revoked or expired key.
async function loadSelf() {
  S.self = (await call('GET', 'v1/keys/self')).data.key;
}

// loadChain reads the first page of an audit hash chain, in chain order, and verifies it: a
// node's changes chain, or (no node) the key-management chain.
async function loadChain(nodeId) {
  const { data } = nodeId
    ? await call('GET', path('v1/nodes', nodeId, 'audit'), { query: { limit: 100 } })
    : await call('GET', 'v1/keys/audit', { query: { limit: 100 } });
  S.chain = { nodeId: nodeId || '', head: data.head, records: data.records, verify: await verifyRecords(data.records) };
}

// ---- actions ----

async function signIn(ev) {
  ev.preventDefault();
  const key = new FormData(ev.target).get('apiKey').trim();
  if (!key) { set({ signInError: 'Enter an API key.' }); return; }
  setKey(key);
  set({ signInError: '' });
  try {
    await loadSelf();
  } catch (err) {
    if (err instanceof Problem && err.status === 401) { fail(err); return; }
    S.self = null; // offer no operator control; each view still shows its own problem
  }
  if (!location.hash || location.hash === '#') location.hash = '#/nodes'; else go();
}

function signOut() {
  forgetKey();
  clearInterval(S.opTimer);
  Object.assign(S, { nodes: null, nodeUnits: {}, node: null, op: null, reservation: null, keys: null, self: null, chain: null, signInError: '' });
  location.hash = '#/nodes';
  draw();
}

const rc = (resId) => (S.reclaim[resId] ||= { reason: '', count: '', plan: null });

function toggleUnit(unitId) {
  S.selection.has(unitId) ? S.selection.delete(unitId) : S.selection.add(unitId);
  for (const r of Object.values(S.reclaim)) { r.plan = null; r.result = null; r.problem = null; }
  draw();
}

// preview asks for the dry run: of the selected units, or, with a count, for a plan.
async function preview(resv) {
  const r = rc(resv.id);
  const base = path('v1/nodes', S.node.nodeId, 'reservations', resv.id);
  const units = selectedOf(resv);
  const count = parseInt(r.count, 10);
  r.problem = null; r.result = null; r.busy = true; draw();
  try {
    let ans;
    if (units.length) ans = await call('POST', base + '/reclaim', { body: { unitIds: units, dryRun: true, ...extras(r) } });
    else if (count > 0) ans = await call('POST', base + '/reclaim-plan', { body: { count, ...extras(r) } });
    else { r.problem = { message: 'Select units on the map, or ask for a count.' }; r.busy = false; draw(); return; }
    setPlan(r, ans.data, ans.etag, ans.data.unitIds || units);
  } catch (err) { r.problem = err; if (err.status === 401) return fail(err); }
  r.busy = false; draw();
}

// extras are the reason and grace a reclaim and its preview share (the plan's tag covers the grace).
function extras(r) {
  const grace = parseInt(r.grace, 10);
  return { ...(r.reason ? { reason: r.reason } : {}), ...(grace > 0 ? { graceSeconds: grace } : {}) };
}

function setPlan(r, plan, etag, unitIds) {
  const before = new Map(S.node.units.map((u) => [u.unitId, u.state]));
  r.plan = { ...plan, unitIds, alreadyYours: unitIds.filter((u) => before.get(u) === 'exclusive') };
  r.etag = plan.planEtag || etag;
  r.idem = newIdempotencyKey();
}

async function doReclaim(resv) {
  const r = rc(resv.id);
  const base = path('v1/nodes', S.node.nodeId, 'reservations', resv.id);
  r.busy = true; r.problem = null; draw();
  try {
    const ans = await call('POST', base + '/reclaim', {
      body: { unitIds: r.plan.unitIds, ...extras(r) },
      headers: { 'If-Match': '"' + r.etag.replace(/^W\//, '').replace(/^"|"$/g, '') + '"', 'Idempotency-Key': r.idem },
    });
    r.busy = false;
    if (ans.data.reclaimId) { S.graceEnds[ans.data.reclaimId] = ans.data.terminateAfter; location.hash = href('nodes', S.node.nodeId, 'reservations', resv.id, 'reclaims', ans.data.reclaimId); return; }
    r.result = ans.data; r.plan = null;
    S.selection = new Set();
    await loadNode(S.node.nodeId);
  } catch (err) {
    r.busy = false;
    if (err instanceof Problem && err.status === 412 && err.body.plan) {
      // The plan changed since the preview: show the new one, ready to send, over the map as it is now.
      const unitIds = err.body.plan.unitIds || r.plan.unitIds;
      try { await loadNode(S.node.nodeId); } catch { /* the plan still shows */ }
      setPlan(r, err.body.plan, err.etag, unitIds);
      r.problem = err;
    } else if (err instanceof Problem && err.status === 401) return fail(err);
    else r.problem = err;
  }
  draw();
}

async function followOperation(nodeId, resId, reclaimId) {
  const url = path('v1/nodes', nodeId, 'reservations', resId, 'reclaims', reclaimId);
  let access = 'view';
  try { access = ((await call('GET', path('v1/nodes', nodeId, 'units'))).data.reservations.find((x) => x.id === resId) || {}).access || 'view'; } catch { /* shown as view */ }
  const poll = async () => {
    try {
      const { data } = await call('GET', url);
      S.op = { nodeId, resId, data, access };
      if (!inFlight(data.state) && S.opTimer) { clearInterval(S.opTimer); S.opTimer = null; }
    } catch (err) { clearInterval(S.opTimer); S.opTimer = null; return fail(err); }
    S.now = Date.now();
    draw();
  };
  S.op = null;
  await poll();
  if (S.op && inFlight(S.op.data.state)) S.opTimer = setInterval(poll, 1000);
}

async function redrive() {
  const { nodeId, resId, data } = S.op;
  try {
    await call('POST', path('v1/nodes', nodeId, 'reservations', resId, 'reclaims', data.id, 'retry'), { headers: { 'Idempotency-Key': newIdempotencyKey() } });
    await followOperation(nodeId, resId, data.id);
  } catch (err) { fail(err); }
}

async function cancelScheduled(id) {
  const { nodeId, resId } = S.reservation;
  try {
    await call('DELETE', path('v1/nodes', nodeId, 'reservations', resId, 'scheduled-reclaims', id));
    await loadReservation(nodeId, resId);
    draw();
  } catch (err) { fail(err); }
}

async function createKey(ev) {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const body = { orgId: f.get('orgId').trim(), permissions: f.getAll('permission'), reason: f.get('reason') || undefined };
  try {
    const { data } = await call('POST', 'v1/keys', { body, headers: { 'Idempotency-Key': newIdempotencyKey() } });
    await loadKeys();
    set({ newSecret: data, error: null });
    ev.target.reset();
  } catch (err) { fail(err); }
}

async function revokeKey(keyId) {
  try {
    await call('POST', path('v1/keys', keyId, 'revoke'), { body: { reason: 'revoked in the console' } });
    await loadKeys();
    set({ error: null });
  } catch (err) { fail(err); }
}

async function registerNode(ev) {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const nodeId = f.get('nodeId').trim();
  const body = {
    ownerOrgId: f.get('ownerOrgId').trim(),
    unitIds: f.get('unitIds').split(/[\s,]+/).filter(Boolean),
    agentEndpoint: f.get('agentEndpoint').trim(),
    ...(f.get('reason') ? { reason: f.get('reason') } : {}),
  };
  try {
    const { data, status } = await call('PUT', path('v1/nodes', nodeId), { body });
    set({ registration: { nodeId, status, data }, error: null });
  } catch (err) { fail(err); }
}

async function rotateAgentKey(nodeId) {
  try {
    const { data } = await call('POST', path('v1/nodes', nodeId, 'agent-key', 'rotate'), { body: { reason: 'rotated in the console' } });
    set({ registration: { nodeId, rotated: true, data }, error: null });
  } catch (err) { fail(err); }
}

// ---- views ----

const age = (since, now) => {
  if (!since) return '';
  let s = Math.max(0, Math.round((now - Date.parse(since)) / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hh = Math.floor(s / 3600); s -= hh * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
};
const time = (t) => (t ? new Date(t).toLocaleTimeString() : '');

function ProblemBox({ err }) {
  if (!err) return null;
  const b = err.body || {};
  return html`<div class="error" role="alert"><strong>${b.title || 'Error'}${err.status ? ` (${err.status})` : ''}</strong>${' '}<span>${b.detail || b.message || err.message}</span>${b.code ? html` <code>${b.code}</code>` : null}</div>`;
}

function SignIn() {
  return html`<main>
    <h1 tabindex="-1">Sign in</h1>
    <p class="note">Your key stays in this tab (sessionStorage) and goes only to this API.</p>
    ${S.signInError ? html`<div class="error" role="alert">${S.signInError}</div>` : null}
    <form onSubmit=${signIn}>
      <label for="apiKey">API key</label>
      <input id="apiKey" name="apiKey" type="password" autocomplete="off" spellcheck="false" required />
      <p><button type="submit">Sign in</button></p>
    </form>
  </main>`;
}

function Header() {
  const k = S.self;
  return html`<header>
    <strong>Capacity console</strong>
    <nav aria-label="Main">
      <a href="#/nodes">Nodes</a>
      ${can('key.manage') ? html`<a href="#/keys">API keys</a>` : null}
      ${can('node.manage') ? html`<a href="#/register">Register a node</a>` : null}
      ${can('audit.read') ? html`<a href="#/audit">Audit chains</a>` : null}
    </nav>
    ${k ? html`<span class="note" data-key-id=${k.keyId}>${k.keyId} (${k.orgId}${k.operator ? ', operator' : ''})</span>` : null}
    <button class="secondary" onClick=${signOut}>Sign out</button>
  </header>`;
}

function Strip({ units }) {
  const counts = {};
  for (const u of units) counts[u.state] = (counts[u.state] || 0) + 1;
  const summary = Object.entries(counts).map(([s, n]) => `${n} ${unitStates[s] ? unitStates[s].text : s}`).join(', ');
  return html`<span class="strip" role="img" aria-label=${`${units.length} units: ${summary}`}>
    ${units.map((u) => html`<span class=${'s-' + u.state} title=${`${u.unitId}: ${(unitStates[u.state] || {}).text || u.state}`} data-unit-id=${u.unitId} data-state=${u.state}>${(unitStates[u.state] || {}).letter || '?'}</span>`)}
  </span>`;
}

function Legend() {
  return html`<ul class="legend" aria-label="Legend">
    ${Object.entries(unitStates).map(([k, v]) => html`<li><span class=${'swatch s-' + k} aria-hidden="true"></span><strong>${v.letter}</strong> ${v.text} <span class="note">(${v.says})</span></li>`)}
  </ul>`;
}

function NodesView() {
  if (!S.nodes) return html`<main><h1 tabindex="-1">Nodes</h1><p>Loading…</p></main>`;
  return html`<main>
    <h1 tabindex="-1">Nodes</h1>
    ${S.nodes.length === 0 ? html`<p>No node is visible to this key.</p>` : html`<table>
      <thead><tr><th scope="col">Node</th><th scope="col">Owner</th><th scope="col">Units</th></tr></thead>
      <tbody>${S.nodes.map((n) => {
        const u = S.nodeUnits[n.nodeId];
        return html`<tr><td><a href=${href('nodes', n.nodeId)}>${n.nodeId}</a></td><td>${n.ownerOrgId || ''}</td>
          <td>${!u ? 'loading…' : u.error ? u.error : html`<${Strip} units=${u.units} />`}</td></tr>`;
      })}</tbody></table>`}
    ${S.nodesCursor ? html`<p><button type="button" class="secondary" onClick=${moreNodes}>More nodes</button></p>` : null}
    <${Legend} />
  </main>`;
}

function UnitCell({ u, manage }) {
  const st = unitStates[u.state] || { text: u.state };
  const selected = S.selection.has(u.unitId);
  const id = 'sel-' + u.unitId;
  return html`<div class=${`unit s-${u.state}${selected ? ' selected' : ''}`} data-unit-id=${u.unitId} data-state=${u.state}>
    <div><span class="id">${u.unitId}</span> <span class="state">${st.text}</span></div>
    ${u.vm ? html`<div class="vm" data-vm-id=${u.vm.vmId || ''} data-vm-state=${u.vm.state}>
      VM <span class="mono">${u.vm.vmId || '(another org\u2019s)'}</span>, ${u.vm.tier}, ${u.vm.state}, ${age(u.vm.since, S.now)}
      ${u.vm.orgId ? html`<div class="note">org ${u.vm.orgId}</div>` : null}
    </div>` : null}
    ${manage ? html`<div><input type="checkbox" id=${id} checked=${selected} onChange=${() => toggleUnit(u.unitId)} /> <label for=${id}>Select ${u.unitId}</label></div>` : null}
  </div>`;
}

const selectedOf = (resv) => [...S.selection].filter((u) => resv.reservedUnitIds.includes(u)).sort();

function ReclaimPanel({ resv }) {
  const r = rc(resv.id);
  const units = selectedOf(resv);
  const p = r.plan;
  const fid = (x) => `${x}-${resv.id}`;
  return html`<section class="panel" aria-label=${`Reclaim from ${resv.id}`}>
    <h3>Reclaim units of ${resv.id}</h3>
    <p>${units.length ? `Selected: ${units.join(', ')}` : 'No unit selected: select units on the map, or ask for a count.'}</p>
    <div class="row">
      <div><label for=${fid('count')}>Count</label>
        <input id=${fid('count')} type="number" min="1" max="64" value=${r.count} disabled=${units.length > 0} onInput=${(e) => { r.count = e.target.value; r.plan = null; draw(); }} /></div>
      <div><label for=${fid('reason')}>Reason</label>
        <input id=${fid('reason')} type="text" maxlength="500" value=${r.reason} onInput=${(e) => { r.reason = e.target.value; }} /></div>
      <div><label for=${fid('grace')}>Grace seconds</label>
        <input id=${fid('grace')} type="number" min="0" max="120" value=${r.grace || ''} onInput=${(e) => { r.grace = e.target.value; r.plan = null; draw(); }} /></div>
      <div><button type="button" class="secondary" disabled=${r.busy} onClick=${() => preview(resv)}>Preview reclaim</button></div>
    </div>
    <${ProblemBox} err=${r.problem} />
    ${p ? html`<div class="ok" role="status" aria-label="Reclaim preview">
      <strong>Preview</strong> (changes nothing) of a reclaim of ${p.unitIds.join(', ')}:
      <ul>
        <li>VMs to terminate: ${p.wouldTerminate && p.wouldTerminate.length ? html`<span data-testid="would-terminate">${p.wouldTerminate.join(', ')}</span>` : 'none'}</li>
        <li>Skipped (other tiers, left running): ${p.wouldSkip && p.wouldSkip.length ? p.wouldSkip.join(', ') : 'none'}</li>
        <li>Units already yours: ${p.alreadyYours.length ? p.alreadyYours.join(', ') : 'none'}</li>
      </ul>
      <button type="button" disabled=${r.busy} onClick=${() => doReclaim(resv)}>Reclaim</button>
    </div>` : null}
    ${r.result ? html`<div class="ok" role="status">Reclaimed: the units are exclusive again, and no VM had to be evicted.</div>` : null}
  </section>`;
}

function NodeView() {
  const n = S.node;
  if (!n || n.nodeId !== S.route[1]) return html`<main><h1 tabindex="-1">Node ${S.route[1]}</h1><p>Loading…</p></main>`;
  const byRes = new Map();
  for (const u of n.units) {
    const k = u.reservationId || '';
    if (!byRes.has(k)) byRes.set(k, []);
    byRes.get(k).push(u);
  }
  const resOf = (id) => (n.reservations || []).find((r) => r.id === id);
  return html`<main>
    <h1 tabindex="-1">Node ${n.nodeId}</h1>
    <p class="note">${n.units.length} units; topology generation ${n.topologyGen}. <a href="#/nodes">All nodes</a></p>
    <${Legend} />
    ${[...byRes.entries()].map(([resId, units]) => {
      const resv = resOf(resId);
      const manage = resv && resv.access === 'manage' && resv.status === 'active';
      return html`<section aria-labelledby=${'g-' + (resId || 'none')}>
        <h2 id=${'g-' + (resId || 'none')}>${resId ? html`Reservation ${resId} <span class="note">(${resv ? `${resv.status}, ${resv.access === 'manage' ? 'you manage it' : 'view only'}` : ''})</span>` : 'Unreserved units'}</h2>
        ${resId ? html`<p><a href=${href('nodes', n.nodeId, 'reservations', resId)}>Reclaims, scheduled reclaims and audit of ${resId}</a></p>` : null}
        <div class="map">${units.map((u) => html`<${UnitCell} u=${u} manage=${manage} />`)}</div>
        ${manage ? html`<${ReclaimPanel} resv=${resv} />` : null}
      </section>`;
    })}
    ${can('audit.read') ? html`<p><a href=${href('audit', n.nodeId)}>Audit chain of ${n.nodeId}</a></p>` : null}
    ${can('node.manage') ? html`<section class="panel" aria-label="Node agent key">
      <h2>Node agent key</h2>
      <button type="button" class="secondary" onClick=${() => rotateAgentKey(n.nodeId)}>Rotate agent key</button>
      ${S.registration && S.registration.rotated && S.registration.nodeId === n.nodeId ? html`<${SecretOnce} label="New agent key" value=${S.registration.data.agentKey} />` : null}
    </section>` : null}
  </main>`;
}

function SecretOnce({ label, value }) {
  return html`<div class="ok" role="status"><strong>${label}</strong> (shown once: copy it now)<div class="secret">${value}</div></div>`;
}

function OperationView() {
  const [, nodeId, , resId, , reclaimId] = S.route;
  const o = S.op && S.op.data;
  if (!o || o.id !== reclaimId) return html`<main><h1 tabindex="-1">Reclaim ${reclaimId}</h1><p>Loading…</p></main>`;
  const after = (o.vms || []).map((v) => v.notice && v.notice.terminateAfter).filter(Boolean).sort()[0] || S.graceEnds[o.id];
  const left = after ? Math.ceil((Date.parse(after) - S.now) / 1000) : 0;
  return html`<main>
    <h1 tabindex="-1">Reclaim ${o.id}</h1>
    <p>Node <a href=${href('nodes', nodeId)}>${nodeId}</a>, reservation <a href=${href('nodes', nodeId, 'reservations', resId)}>${resId}</a>; units ${o.unitIds.join(', ')}; started ${time(o.createdAt)}.</p>
    <p role="status" aria-live="polite">State: <strong data-op-state=${o.state}>${o.state}</strong>${o.reason ? ` (${o.reason})` : ''}</p>
    ${inFlight(o.state) && left > 0 ? html`<p class="countdown" aria-live="off">Grace: ${left} s before termination</p>` : null}
    ${o.vms ? html`<table><caption>VMs evicted</caption>
      <thead><tr><th scope="col">VM</th><th scope="col">Notice</th><th scope="col">Outcome</th><th scope="col">At</th></tr></thead>
      <tbody>${o.vms.map((v) => html`<tr data-vm-id=${v.vmId} data-vm-state=${v.outcome}>
        <td class="mono">${v.vmId}</td>
        <td>${v.notice ? `${v.notice.state} at ${time(v.notice.at)}` : 'not sent'}</td>
        <td>${v.outcome}${v.error ? html`<div class="note">${v.error}</div>` : null}</td>
        <td>${time(v.at)}</td></tr>`)}</tbody></table>` : null}
    ${o.vmCounts ? html`<p>VMs: ${o.vmCounts.pending} pending, ${o.vmCounts.terminated} terminated, ${o.vmCounts.alreadyGone} already gone, ${o.vmCounts.failed} failed.</p>` : null}
    ${o.state === 'failed' && S.op.access === 'manage' ? html`<p><button type="button" onClick=${redrive}>Re-drive the termination</button></p>` : null}
  </main>`;
}

function ReservationView() {
  const v = S.reservation;
  const [, nodeId, , resId] = S.route;
  if (!v || v.resId !== resId || v.nodeId !== nodeId) return html`<main><h1 tabindex="-1">Reservation ${resId}</h1><p>Loading…</p></main>`;
  const r = v.res;
  return html`<main>
    <h1 tabindex="-1">Reservation ${r.id}</h1>
    <p>On node <a href=${href('nodes', nodeId)}>${nodeId}</a>; ${r.status}; units ${r.reservedUnitIds.join(', ')}; released ${r.releasedUnitIds.join(', ') || 'none'}.</p>
    <h2>Reclaims</h2>
    ${v.reclaims.problem ? html`<${ProblemBox} err=${v.reclaims.problem} />` : v.reclaims.data.reclaims.length === 0 ? html`<p>None.</p>` : html`<table>
      <thead><tr><th scope="col">Reclaim</th><th scope="col">State</th><th scope="col">Units</th><th scope="col">Created</th></tr></thead>
      <tbody>${v.reclaims.data.reclaims.map((o) => html`<tr><td><a href=${href('nodes', nodeId, 'reservations', resId, 'reclaims', o.id)}>${o.id}</a></td><td>${o.state}</td><td>${o.unitIds.join(', ')}</td><td>${time(o.createdAt)}</td></tr>`)}</tbody></table>`}
    <h2>Scheduled reclaims</h2>
    ${v.scheduled.problem ? html`<${ProblemBox} err=${v.scheduled.problem} />` : v.scheduled.data.scheduledReclaims.length === 0 ? html`<p>None.</p>` : html`<table>
      <thead><tr><th scope="col">At</th><th scope="col">Units</th><th scope="col">State</th><th scope="col">Reason</th><th scope="col">Action</th></tr></thead>
      <tbody>${v.scheduled.data.scheduledReclaims.map((s) => html`<tr><td>${new Date(s.at).toLocaleString()}</td><td>${s.unitIds.join(', ')}</td><td>${s.state}</td><td>${s.reason}</td>
        <td>${s.state === 'scheduled' ? html`<button type="button" class="secondary" aria-label=${`Cancel the scheduled reclaim at ${s.at}`} onClick=${() => cancelScheduled(s.id)}>Cancel</button>` : ''}</td></tr>`)}</tbody></table>`}
    <h2>Audit trail</h2>
    ${v.audit.problem ? html`<${ProblemBox} err=${v.audit.problem} />` : html`
      <p role="status" class=${v.verify.ok ? 'ok' : 'error'}>${v.verify.text}</p>
      <table><thead><tr><th scope="col">Time</th><th scope="col">Action</th><th scope="col">Outcome</th><th scope="col">Units</th><th scope="col">Reason</th><th scope="col">Caller</th><th scope="col">Via</th></tr></thead>
      <tbody>${v.records.map((a) => html`<tr data-audit-id=${a.id}><td>${time(a.time)}</td><td>${a.action}${a.dryRun ? ' (dry run)' : ''}</td><td>${a.outcome}</td><td>${a.unitIds.join(', ')}</td>
        <td data-testid="audit-reason">${a.reason}</td><td>${a.callerOrgId} <span class="note">${a.actorKeyId}</span></td><td>${a.via}</td></tr>`)}</tbody></table>`}
  </main>`;
}

const permissions = ['reservation.read', 'reservation.capacity', 'vm.place', 'node.manage', 'reservation.manage', 'key.manage', 'audit.read'];

function KeysView() {
  return html`<main>
    <h1 tabindex="-1">API keys</h1>
    ${S.newSecret ? html`<${SecretOnce} label=${`Secret of the new key ${S.newSecret.key ? S.newSecret.key.keyId : ''}`} value=${S.newSecret.secret} />` : null}
    <form class="panel" onSubmit=${createKey}>
      <h2>New key</h2>
      <label for="orgId">Org id</label><input id="orgId" name="orgId" type="text" required />
      <fieldset><legend>Permissions</legend>
        ${permissions.map((p) => html`<div><input type="checkbox" id=${'perm-' + p} name="permission" value=${p} /> <label for=${'perm-' + p}>${p}</label></div>`)}
      </fieldset>
      <label for="keyReason">Reason</label><input id="keyReason" name="reason" type="text" />
      <p><button type="submit">Create key</button></p>
    </form>
    <h2>Keys</h2>
    ${!S.keys ? html`<p>Loading…</p>` : html`<table><thead><tr><th scope="col">Key</th><th scope="col">Org</th><th scope="col">Permissions</th><th scope="col">State</th><th scope="col">Action</th></tr></thead>
      <tbody>${S.keys.map((k) => html`<tr><td class="mono">${k.keyId}</td><td>${k.orgId}</td><td>${(k.permissions || []).join(', ')}</td><td>${k.revoked ? 'revoked' : 'active'}</td>
        <td>${k.revoked ? '' : html`<button type="button" class="secondary" aria-label=${`Revoke ${k.keyId}`} onClick=${() => revokeKey(k.keyId)}>Revoke</button>`}</td></tr>`)}</tbody></table>`}
  </main>`;
}

function RegisterView() {
  const reg = S.registration;
  return html`<main>
    <h1 tabindex="-1">Register a node</h1>
    <p class="note">Registers a node, or changes its owner org and agent endpoint (needs node.manage; the API decides).</p>
    <form class="panel" onSubmit=${registerNode}>
      <label for="nodeId">Node id</label><input id="nodeId" name="nodeId" type="text" required />
      <label for="ownerOrgId">Owner org id</label><input id="ownerOrgId" name="ownerOrgId" type="text" required />
      <label for="unitIds">Unit ids (comma or space separated)</label><input id="unitIds" name="unitIds" type="text" required />
      <label for="agentEndpoint">Agent endpoint</label><input id="agentEndpoint" name="agentEndpoint" type="text" required />
      <label for="regReason">Reason</label><input id="regReason" name="reason" type="text" />
      <p><button type="submit">Register</button></p>
    </form>
    ${reg && !reg.rotated ? html`<div class="ok" role="status">Node <a href=${href('nodes', reg.nodeId)}>${reg.nodeId}</a> ${reg.status === 201 ? 'registered' : 'updated'}.</div>
      ${reg.data.agentKey ? html`<${SecretOnce} label="Agent key" value=${reg.data.agentKey} />` : null}` : null}
  </main>`;
}

// ChainView is an audit hash chain (operators with audit.read): a node's changes, or the
// key-management chain, each record verified as on a reservation's trail.
function ChainView() {
  const v = S.chain;
  const nodeId = S.route[1] || '';
  const title = nodeId ? `Audit chain of ${nodeId}` : 'Audit chain of API keys';
  if (!v || v.nodeId !== nodeId) return html`<main><h1 tabindex="-1">${title}</h1><p>Loading…</p></main>`;
  return html`<main>
    <h1 tabindex="-1">${title}</h1>
    <p class="note">Head: seq ${v.head.seq}. ${nodeId ? html`<a href="#/audit">Audit chain of API keys</a>` : null}</p>
    <p role="status" class=${v.verify.ok ? 'ok' : 'error'}>${v.verify.text}</p>
    <table><thead><tr><th scope="col">Seq</th><th scope="col">Time</th><th scope="col">Action</th><th scope="col">Outcome</th><th scope="col">${nodeId ? 'Units' : 'Key'}</th><th scope="col">Reason</th><th scope="col">Caller</th></tr></thead>
      <tbody>${v.records.map((a) => html`<tr data-audit-id=${a.id}><td>${a.seq}</td><td>${time(a.time)}</td><td>${a.action}</td><td>${a.outcome}</td>
        <td>${nodeId ? (a.unitIds || []).join(', ') : a.targetKeyId}</td><td>${a.reason}</td><td>${a.callerOrgId} <span class="note">${a.actorKeyId}</span></td></tr>`)}</tbody></table>
  </main>`;
}

// NotOffered is an operator page asked for by address with a key that may not use it.
function NotOffered({ title, perm }) {
  return html`<main><h1 tabindex="-1">${title}</h1><p>This key does not hold ${perm} as an operator key, so this page is not offered.</p></main>`;
}

function App() {
  if (!getKey()) return html`<${SignIn} />`;
  const [a, , c, , e] = S.route;
  let view;
  if (a === 'keys') view = can('key.manage') ? html`<${KeysView} />` : html`<${NotOffered} title="API keys" perm="key.manage" />`;
  else if (a === 'register') view = can('node.manage') ? html`<${RegisterView} />` : html`<${NotOffered} title="Register a node" perm="node.manage" />`;
  else if (a === 'audit') view = can('audit.read') ? html`<${ChainView} />` : html`<${NotOffered} title="Audit chains" perm="audit.read" />`;
  else if (a === 'nodes' && c === 'reservations' && e === 'reclaims') view = html`<${OperationView} />`;
  else if (a === 'nodes' && c === 'reservations') view = html`<${ReservationView} />`;
  else if (a === 'nodes' && S.route[1]) view = html`<${NodeView} />`;
  else view = html`<${NodesView} />`;
  return html`<${Header} />${S.error ? html`<div class="pad"><${ProblemBox} err=${S.error} /></div>` : null}${view}`;
}

function draw() { render(html`<${App} />`, root); }

window.addEventListener('hashchange', go);
// The countdown and ages move with the clock.
setInterval(() => { if (S.op && S.op.data && inFlight(S.op.data.state)) { S.now = Date.now(); draw(); } }, 1000);
// A reload keeps the tab's key: learn what it may do before the first view is drawn.
if (getKey()) loadSelf().catch(fail).finally(go); else go();
