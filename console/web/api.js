// The API, called from the page's own origin: the API's base is the folder above the
// console's ("<API>/console/" -> "<API>/"). The key lives in sessionStorage only.
const keyName = 'capacity.apiKey';

export const apiBase = new URL('../', location.href);

export const getKey = () => sessionStorage.getItem(keyName);
export const setKey = (k) => sessionStorage.setItem(keyName, k);
export const forgetKey = () => sessionStorage.removeItem(keyName);

// Problem is a failed call: the problem+json body when there is one, and the ETag it carried
// (a 412's new plan).
export class Problem extends Error {
  constructor(status, body, etag) {
    super((body && (body.detail || body.title || body.message)) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
    this.etag = etag;
  }
}

// path builds "v1/nodes/<id>/..." from segments, each escaped.
export const path = (...segs) => segs.map((s, i) => (i === 0 ? s : encodeURIComponent(s))).join('/');

// call sends one request with the key and answers {data, etag, status}; anything but 2xx
// throws a Problem.
export async function call(method, p, { body, headers = {}, query } = {}) {
  const url = new URL(p, apiBase);
  for (const [k, v] of Object.entries(query || {})) if (v !== undefined && v !== '') url.searchParams.set(k, v);
  const h = { Authorization: 'Bearer ' + (getKey() || ''), ...headers };
  if (body !== undefined) h['Content-Type'] = 'application/json';
  const res = await fetch(url, {
    method, headers: h, body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer', redirect: 'error',
  });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok) throw new Problem(res.status, data, res.headers.get('ETag'));
  return { data, etag: res.headers.get('ETag'), status: res.status };
}

// newIdempotencyKey names one attempt, so that a repeated click replays instead of applying twice.
export const newIdempotencyKey = () => 'console-' + crypto.randomUUID();
