package stack

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// fixRESTProxyEvent corrects kumo's API Gateway fidelity bug in a Lambda invocation payload.
//
// kumo builds a REST (v1) proxy event with the resource TEMPLATE in path and
// requestContext.path ("/items/{id}"); only pathParameters carry the request's values. AWS sends
// the real, still percent-encoded request path, and routers such as aws-lambda-go-api-proxy
// route on it. So for a REST proxy event (one with resource, pathParameters and requestContext)
// whose path is still the template, this fills the parameters into the template, escaping each
// value as a path segment (a greedy {name+} value segment by segment), and sets path and
// requestContext.path ("/<stage>" + path) from it; resource and requestContext.resourcePath
// keep the template, as on AWS.
//
// Anything else, including invalid JSON and events whose path is already real, is returned
// unchanged (the same slice), so other payloads pass through byte-identical.
func fixRESTProxyEvent(payload []byte) []byte {
	var event map[string]json.RawMessage
	if err := json.Unmarshal(payload, &event); err != nil {
		return payload
	}

	rawResource, ok1 := event["resource"]
	rawParams, ok2 := event["pathParameters"]
	rawContext, ok3 := event["requestContext"]

	if !ok1 || !ok2 || !ok3 {
		return payload
	}

	var (
		resource, path string
		params         map[string]string
		reqContext     map[string]json.RawMessage
	)

	if json.Unmarshal(rawResource, &resource) != nil ||
		json.Unmarshal(rawParams, &params) != nil ||
		json.Unmarshal(rawContext, &reqContext) != nil || reqContext == nil {
		return payload
	}

	// Only correct what kumo got wrong: a path that differs from the template is already real
	// (a kumo release that fixes the bug then passes through untouched).
	if raw, ok := event["path"]; ok && (json.Unmarshal(raw, &path) != nil || path != resource) {
		return payload
	}

	realPath := fillPathTemplate(resource, params)
	if realPath == resource {
		return payload
	}

	var stage string
	_ = json.Unmarshal(reqContext["stage"], &stage)

	contextPath := realPath
	if stage != "" && stage != "$default" {
		contextPath = "/" + stage + realPath
	}

	event["path"] = jsonString(realPath)
	reqContext["path"] = jsonString(contextPath)

	rc, err := json.Marshal(reqContext)
	if err != nil {
		return payload
	}

	event["requestContext"] = rc

	out, err := json.Marshal(event)
	if err != nil {
		return payload
	}

	return out
}

// fillPathTemplate replaces {name} and {name+} segments of an API Gateway resource path with
// the escaped parameter values. A segment without a value stays as it is.
func fillPathTemplate(template string, params map[string]string) string {
	segs := strings.Split(template, "/")

	for i, seg := range segs {
		name, ok := strings.CutPrefix(seg, "{")
		if !ok {
			continue
		}

		if name, ok = strings.CutSuffix(name, "}"); !ok {
			continue
		}

		greedy := strings.HasSuffix(name, "+")
		name = strings.TrimSuffix(name, "+")

		val, ok := params[name]
		if !ok {
			continue
		}

		if !greedy {
			segs[i] = url.PathEscape(val)

			continue
		}

		parts := strings.Split(val, "/")
		for j, p := range parts {
			parts[j] = url.PathEscape(p)
		}

		segs[i] = strings.Join(parts, "/")
	}

	return strings.Join(segs, "/")
}

// fixInvokedFunctionARN corrects the Lambda-Runtime-Invoked-Function-Arn header, to which kumo
// writes the region "local" (arn:aws:lambda:local:...); AWS sends the function's real ARN.
func fixInvokedFunctionARN(arn string) string {
	if rest, ok := strings.CutPrefix(arn, "arn:aws:lambda:local:"); ok {
		return "arn:aws:lambda:" + region + ":" + rest
	}

	return arn
}

func jsonString(s string) json.RawMessage {
	data, _ := json.Marshal(s) // a string always marshals

	return data
}

// trailingSlashHeader tells restoreTrailingSlash whether the request's path ended in "/"
// ("1") or not ("0"). The proxy sets it on every execute-api request (replacing a caller's
// own), because kumo trims the slash before matching: it reports "/console/" to the function
// as "/console", and "/console" as "/console/" when it matched "/console/{proxy+}" with an
// empty value, which AWS never does. AWS sends the path as requested, and the console's page,
// whose files are addressed relative to it, needs it so (the bare path is redirected to it).
const trailingSlashHeader = "X-Local-Trailing-Slash"

// markTrailingSlash sets trailingSlashHeader on an execute-api request (/{stage}/{path...}).
func markTrailingSlash(r *http.Request) {
	r.Header.Del(trailingSlashHeader)
	if !strings.Contains(r.Host, ".execute-api.") {
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/")
	_, rest, _ := strings.Cut(p, "/")
	if rest != "" && strings.HasSuffix(rest, "/") {
		r.Header.Set(trailingSlashHeader, "1")
	} else {
		r.Header.Set(trailingSlashHeader, "0")
	}
}

// hostHeader carries the host the caller addressed the API by. kumo builds the event's
// headers without Host (Go's server keeps it out of the header map), where AWS sends the
// execute-api host and X-Forwarded-Proto; the function builds absolute addresses (a problem's
// type) from them. The proxy sets it on every execute-api request, replacing a caller's own.
const hostHeader = "X-Local-Host"

// markHost sets hostHeader to host, and X-Forwarded-Proto to what the caller spoke (plain
// HTTP on the local stack), as API Gateway does on AWS whatever the caller sent.
func markHost(r *http.Request, host string) {
	r.Header.Set(hostHeader, host)
	r.Header.Set("X-Forwarded-Proto", "http")
}

// restoreTrailingSlash takes trailingSlashHeader out of a REST proxy event's headers and makes
// path and requestContext.path end in "/" exactly when the request's did; it turns hostHeader
// into the Host header AWS sends. Other payloads come back unchanged.
func restoreTrailingSlash(payload []byte) []byte {
	if !bytes.Contains(payload, []byte(trailingSlashHeader)) {
		return payload
	}
	var event map[string]json.RawMessage
	if err := json.Unmarshal(payload, &event); err != nil {
		return payload
	}
	var headers map[string]string
	var multi map[string][]string
	var reqContext map[string]json.RawMessage
	var eventPath, contextPath string
	if json.Unmarshal(event["headers"], &headers) != nil || json.Unmarshal(event["requestContext"], &reqContext) != nil ||
		json.Unmarshal(event["path"], &eventPath) != nil {
		return payload
	}
	_ = json.Unmarshal(event["multiValueHeaders"], &multi)
	_ = json.Unmarshal(reqContext["path"], &contextPath)
	mark, host := "", ""
	for k := range headers {
		switch {
		case strings.EqualFold(k, trailingSlashHeader):
			mark = headers[k]
			delete(headers, k)
		case strings.EqualFold(k, hostHeader):
			host = headers[k]
			delete(headers, k)
		}
	}
	for k := range multi {
		if strings.EqualFold(k, trailingSlashHeader) || strings.EqualFold(k, hostHeader) {
			delete(multi, k)
		}
	}
	if host != "" {
		headers["Host"] = host
		if multi != nil {
			multi["Host"] = []string{host}
		}
	}
	switch {
	case mark == "1" && !strings.HasSuffix(eventPath, "/"):
		eventPath += "/"
		if contextPath != "" && !strings.HasSuffix(contextPath, "/") {
			contextPath += "/"
		}
	case mark == "0" && eventPath != "/" && strings.HasSuffix(eventPath, "/"):
		eventPath = strings.TrimSuffix(eventPath, "/")
		contextPath = strings.TrimSuffix(contextPath, "/")
	}
	event["headers"] = mustJSON(headers)
	if multi != nil {
		event["multiValueHeaders"] = mustJSON(multi)
	}
	event["path"] = jsonString(eventPath)
	if contextPath != "" {
		reqContext["path"] = jsonString(contextPath)
		event["requestContext"] = mustJSON(reqContext)
	}
	out, err := json.Marshal(event)
	if err != nil {
		return payload
	}
	return out
}

func mustJSON(v any) json.RawMessage {
	data, _ := json.Marshal(v) // maps of strings and raw JSON always marshal
	return data
}
