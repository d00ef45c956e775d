package capacity

import (
	"fmt"
	"net/url"
	"strings"
)

// ParseAgentEndpoint parses a node agent's base URL, the one check that both registration
// (PUT /v1/nodes/{nodeId}) and the agent client (shared/agent) apply: an endpoint the client
// would refuse is refused at registration, so no node can be registered into termination
// failures that no retry ends. It must be an absolute https URL with a host (plain http only
// when allowHTTP: the local stack, whose agents listen on loopback), without user info (it
// would travel and be logged with every call), query or fragment (the client appends the
// contract's paths, which a query or fragment would swallow), at most MaxEndpointLen bytes.
// A refusal is an *Error invalid_request saying what is wrong.
func ParseAgentEndpoint(s string, allowHTTP bool) (*url.URL, error) {
	want := "an absolute https URL"
	if allowHTTP {
		want = "an absolute http or https URL"
	}
	bad := func(why string) error {
		return Errorf(CodeInvalidRequest, "agentEndpoint must be %s with a host and no user info, query or fragment, at most %d characters: %s",
			want, MaxEndpointLen, why)
	}
	if s == "" {
		return nil, bad("it is empty")
	}
	if len(s) > MaxEndpointLen {
		return nil, bad(fmt.Sprintf("it is %d characters", len(s)))
	}
	u, err := url.Parse(s)
	switch {
	case strings.ContainsFunc(s, UnsafeRune):
		return nil, bad("it holds control characters")
	case err != nil:
		return nil, bad("it does not parse")
	case u.Scheme == "http" && !allowHTTP:
		return nil, bad("plain http is allowed only on the local stack")
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, bad(fmt.Sprintf("scheme %q", u.Scheme))
	case u.Host == "":
		return nil, bad("no host")
	case u.User != nil:
		return nil, bad("it has user info")
	case u.RawQuery != "" || u.ForceQuery:
		return nil, bad("it has a query string")
	case strings.Contains(s, "#"): // url.Parse drops an empty one without a trace
		return nil, bad("it has a fragment")
	}
	return u, nil
}
