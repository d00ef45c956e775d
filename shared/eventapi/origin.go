package eventapi

import (
	"encoding/json"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/openrelay/capacity/shared/capacity"
)

// Origin is where a genuine request comes from: the environment's intake queue, fed only by
// the bus rules of the environment's bus in this account. The queue's policy is what proves
// it on AWS (it denies sqs:SendMessage to everything but those rules); these checks keep a
// record from anywhere else from acting if a queue is mapped to the function by mistake, or an
// event of another account or bus is forwarded into it. Empty fields are not checked (tests).
type Origin struct {
	// QueueARN is the intake queue: each record's eventSourceARN must be it.
	QueueARN string
	// Account and Region are the stack's: an event's account and region must be them.
	Account, Region string
	// Bus is the environment's bus name. AWS's envelope does not name the bus (the queue
	// policy proves it); a delivery that does name one (event-bus-name) must name this one.
	Bus string
}

// checkQueue refuses a record that did not come from the intake queue.
func (o Origin) checkQueue(rec events.SQSMessage) error {
	if o.QueueARN != "" && rec.EventSourceARN != o.QueueARN {
		return fmt.Errorf("message %s comes from %q, not from the intake queue %s", rec.MessageId, rec.EventSourceARN, o.QueueARN)
	}
	return nil
}

// checkEvent refuses (forbidden, final) an event of another account, region or bus; body is
// the record's raw event.
func (o Origin) checkEvent(env events.CloudWatchEvent, body string) error {
	if o.Account != "" && env.AccountID != o.Account {
		return capacity.Errorf(capacity.CodeForbidden, "event %s is from account %q, not this environment's", env.ID, env.AccountID)
	}
	if o.Region != "" && env.Region != o.Region {
		return capacity.Errorf(capacity.CodeForbidden, "event %s is from region %q, not this environment's", env.ID, env.Region)
	}
	if o.Bus != "" {
		if bus := busName(body); bus != "" && bus != o.Bus {
			return capacity.Errorf(capacity.CodeForbidden, "event %s was put on bus %q, not %s", env.ID, bus, o.Bus)
		}
	}
	return nil
}

// busName is the "event-bus-name" member some deliveries add to the envelope ("" if none);
// events.CloudWatchEvent has no field for it.
func busName(body string) string {
	var m struct {
		Bus string `json:"event-bus-name"`
	}
	_ = json.Unmarshal([]byte(body), &m) // the envelope was decoded already
	return m.Bus
}
