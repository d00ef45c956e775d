package stack

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// kumoSelfAddr is where kumo calls itself: its API Gateway, EventBridge and Step Functions
// invoke Lambda (and Step Functions its other service integrations, EventBridge its SQS
// targets) over HTTP at the hard-coded http://localhost:4566, through net/http's default
// transport. It reads KUMO_PORT only in its package init, and Step Functions not at all.
const kumoSelfAddr = "localhost:4566"

// routeSelfCalls sends every connection this process makes to kumoSelfAddr through the
// default transport to target, the stack's own listener. Without it a stack on another
// address would invoke whatever listens on port 4566: nothing, or another stack, whose
// functions of the same name would then run this stack's events.
//
// The default transport is patched, not replaced, because code in the process (the Lambda
// runtime client, the agent client) clones it as an *http.Transport. kumo is one per process
// (see kumoClaimed), so this is done once and never undone: after Close a self-call meets the
// closed address rather than another stack.
func routeSelfCalls(target string) error {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return errors.New("local stack: http.DefaultTransport is not an *http.Transport, so kumo's calls to itself cannot be routed to this stack")
	}

	dial := t.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}

	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == kumoSelfAddr {
			addr = target
		}

		return dial(ctx, network, addr)
	}

	// Idle connections to localhost:4566 were made to whatever listened there before.
	t.CloseIdleConnections()

	return nil
}
