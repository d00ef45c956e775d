// Verifies audit records as docs/api.md "The hash chain" says: each record's hash is the hex
// SHA-256 of its canonical JSON (the record as served, less hash; targetKeyId, grants and
// start only when set, after victims), encoded as Go's encoding/json encodes it. Where two
// records of the page follow each other in one chain (seq n and n+1), the later's prevHash
// must be the earlier's hash.

// goJSON is JSON.stringify with Go's escaping of <, >, & and U+2028/U+2029.
const goJSON = (v) => JSON.stringify(v).replace(/[<>&\u2028\u2029]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));

function canonical(rec) {
  const out = {};
  for (const [k, v] of Object.entries(rec)) {
    if (k === 'hash' || k === 'targetKeyId' || k === 'grants' || k === 'start') continue;
    out[k] = v;
  }
  if (rec.targetKeyId) out.targetKeyId = rec.targetKeyId;
  if (rec.grants) {
    const g = rec.grants;
    out.grants = { orgId: g.orgId, permissions: [...(g.permissions || [])].sort(), operator: g.operator, expiresAt: g.expiresAt || '' };
    if (g.rateLimit) out.grants.rateLimit = g.rateLimit;
  }
  if (rec.start) out.start = rec.start;
  return goJSON(out);
}

async function sha256Hex(text) {
  const sum = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  return [...new Uint8Array(sum)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

// verifyRecords answers {ok, text}: every hash recomputed, every link within the page checked.
export async function verifyRecords(records) {
  if (!records.length) return { ok: true, text: 'No audit record yet.' };
  if (!crypto.subtle) return { ok: false, text: 'This browser cannot compute SHA-256 here (a secure context is needed): not verified.' };
  const bad = [];
  const byHash = new Map();
  for (const r of records) {
    if ((await sha256Hex(canonical(r))) !== r.hash) bad.push(`${r.id}: hash does not match its content`);
    byHash.set(r.hash, r);
  }
  let links = 0;
  for (const r of records) {
    const prev = byHash.get(r.prevHash);
    if (prev) { links++; if (prev.seq !== r.seq - 1) bad.push(`${r.id}: seq ${r.seq} follows seq ${prev.seq}`); }
  }
  if (bad.length) return { ok: false, text: `Chain verify FAILED: ${bad.join('; ')}` };
  return { ok: true, text: `Chain verify: all ${records.length} records' hashes recomputed and match; ${links} links within this page checked.` };
}
