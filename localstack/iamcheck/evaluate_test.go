package iamcheck

import (
	"strings"
	"testing"
)

const (
	role       = "arn:aws:iam::000000000000:role/api"
	other      = "arn:aws:iam::000000000000:role/other"
	account    = "000000000000"
	stateTable = "arn:aws:dynamodb:us-east-1:000000000000:table/state"
	keyARN     = "arn:aws:kms:us-east-1:000000000000:key/k1"
	busARN     = "arn:aws:events:us-east-1:000000000000:event-bus/capacity-local"
)

func allow(actions, resources []string, conds ...Condition) Statement {
	return Statement{Sid: "S", Effect: "Allow", Action: actions, Resource: resources, Conditions: conds, Policy: "P"}
}

func list(s ...string) []string { return s }

func TestEvaluate(t *testing.T) {
	leading := func(pks ...string) map[string][]string { return map[string][]string{"dynamodb:LeadingKeys": pks} }
	opPartitions := Condition{Operator: "ForAllValues:StringLike", Key: "dynamodb:LeadingKeys", Values: list("NODE#*#OP#*")}
	agentKey := []Condition{
		{Operator: "StringEquals", Key: "kms:EncryptionContext:purpose", Values: list("capacity-agent-key")},
		{Operator: "Null", Key: "kms:EncryptionContext:nodeId", Values: list("false")},
	}
	kmsKnown := []string{"kms:EncryptionContext:", "kms:EncryptionContextKeys"}
	keyPolicyRoot := Statement{Effect: "Allow", Action: list("kms:*"), Resource: list("*"), Principals: list("arn:aws:iam::000000000000:root"), Policy: "KeyPolicy"}
	busDeny := Statement{Sid: "OnlyItsSenders", Effect: "Deny", Action: list("events:PutEvents"), Resource: list(busARN), Principals: list("*"), Policy: "BusPolicy",
		Conditions: []Condition{
			{Operator: "StringEquals", Key: "events:source", Values: list("openrelay.capacity")},
			{Operator: "ArnNotEquals", Key: "aws:PrincipalArn", Values: list(other)},
		}}

	tests := []struct {
		name        string
		pol         Policies
		req         Request
		want        bool
		wantReason  string
		principalAR string // default role
	}{
		{name: "exact action and resource", pol: Policies{Identity: []Statement{allow(list("dynamodb:GetItem"), list(stateTable))}},
			req: Request{Action: "dynamodb:GetItem", Resource: stateTable}, want: true},
		{name: "another action", pol: Policies{Identity: []Statement{allow(list("dynamodb:GetItem"), list(stateTable))}},
			req: Request{Action: "dynamodb:DeleteItem", Resource: stateTable}, wantReason: "no statement allows it"},
		{name: "actions compare without case", pol: Policies{Identity: []Statement{allow(list("DynamoDB:getitem"), list(stateTable))}},
			req: Request{Action: "dynamodb:GetItem", Resource: stateTable}, want: true},
		{name: "action wildcard", pol: Policies{Identity: []Statement{allow(list("dynamodb:*Item"), list(stateTable))}},
			req: Request{Action: "dynamodb:UpdateItem", Resource: stateTable}, want: true},
		{name: "action wildcard does not stretch", pol: Policies{Identity: []Statement{allow(list("dynamodb:Get*"), list(stateTable))}},
			req: Request{Action: "dynamodb:BatchGetItem", Resource: stateTable}},
		{name: "a table grant does not cover its index", pol: Policies{Identity: []Statement{allow(list("dynamodb:Query"), list(stateTable))}},
			req: Request{Action: "dynamodb:Query", Resource: stateTable + "/index/byState"}},
		{name: "resource wildcard crosses slashes", pol: Policies{Identity: []Statement{allow(list("dynamodb:Query"), list(stateTable+"/*"))}},
			req: Request{Action: "dynamodb:Query", Resource: stateTable + "/index/byState"}, want: true},
		{name: "? matches one character", pol: Policies{Identity: []Statement{allow(list("secretsmanager:GetSecretValue"), list("arn:aws:secretsmanager:us-east-1:000000000000:secret:m-??????"))}},
			req: Request{Action: "secretsmanager:GetSecretValue", Resource: "arn:aws:secretsmanager:us-east-1:000000000000:secret:m-AbCdEf"}, want: true},
		{name: "? does not match two", pol: Policies{Identity: []Statement{allow(list("secretsmanager:GetSecretValue"), list("arn:aws:secretsmanager:us-east-1:000000000000:secret:m-??????"))}},
			req: Request{Action: "secretsmanager:GetSecretValue", Resource: "arn:aws:secretsmanager:us-east-1:000000000000:secret:m-AbCdEfG"}},
		{name: "resources compare with case", pol: Policies{Identity: []Statement{allow(list("dynamodb:GetItem"), list(strings.ToUpper(stateTable)))}},
			req: Request{Action: "dynamodb:GetItem", Resource: stateTable}},
		{name: "an explicit deny wins", pol: Policies{Identity: []Statement{allow(list("dynamodb:*"), list("*")),
			{Sid: "NoDelete", Effect: "Deny", Action: list("dynamodb:DeleteItem"), Resource: list("*"), Policy: "P"}}},
			req: Request{Action: "dynamodb:DeleteItem", Resource: stateTable}, wantReason: "explicitly denied by P/NoDelete"},
		{name: "NotAction", pol: Policies{Identity: []Statement{{Effect: "Allow", NotAction: list("dynamodb:Delete*"), Resource: list("*"), Policy: "P"}}},
			req: Request{Action: "dynamodb:DeleteItem", Resource: stateTable}},
		{name: "NotResource", pol: Policies{Identity: []Statement{{Effect: "Allow", Action: list("dynamodb:GetItem"), NotResource: list(stateTable), Policy: "P"}}},
			req: Request{Action: "dynamodb:GetItem", Resource: stateTable}},
		{name: "leading keys inside the pattern", pol: Policies{Identity: []Statement{allow(list("dynamodb:UpdateItem"), list(stateTable), opPartitions)}},
			req: Request{Action: "dynamodb:UpdateItem", Resource: stateTable, Context: leading("NODE#n1#OP#rcl_1")}, want: true},
		{name: "leading keys outside the pattern", pol: Policies{Identity: []Statement{allow(list("dynamodb:UpdateItem"), list(stateTable), opPartitions)}},
			req: Request{Action: "dynamodb:UpdateItem", Resource: stateTable, Context: leading("NODE#n1")}},
		{name: "ForAllValues: one value outside fails", pol: Policies{Identity: []Statement{allow(list("dynamodb:UpdateItem"), list(stateTable), opPartitions)}},
			req: Request{Action: "dynamodb:UpdateItem", Resource: stateTable, Context: leading("NODE#n1#OP#a", "NODE#n1")}},
		{name: "ForAllValues holds vacuously when the key is absent", pol: Policies{Identity: []Statement{allow(list("dynamodb:Scan"), list(stateTable), opPartitions)}},
			req: Request{Action: "dynamodb:Scan", Resource: stateTable, Known: list("dynamodb:LeadingKeys")}, want: true},
		{name: "agent key context", pol: Policies{Identity: []Statement{allow(list("kms:Decrypt"), list(keyARN), agentKey...)}, Resource: []Statement{keyPolicyRoot}, ResourceMustAllow: true},
			req: Request{Action: "kms:Decrypt", Resource: keyARN, Known: kmsKnown,
				Context: map[string][]string{"kms:EncryptionContext:purpose": {"capacity-agent-key"}, "kms:EncryptionContext:nodeId": {"n1"}}}, want: true},
		{name: "agent key context without the node (Null)", pol: Policies{Identity: []Statement{allow(list("kms:Decrypt"), list(keyARN), agentKey...)}, Resource: []Statement{keyPolicyRoot}, ResourceMustAllow: true},
			req: Request{Action: "kms:Decrypt", Resource: keyARN, Known: kmsKnown,
				Context: map[string][]string{"kms:EncryptionContext:purpose": {"capacity-agent-key"}}}},
		{name: "another purpose", pol: Policies{Identity: []Statement{allow(list("kms:Decrypt"), list(keyARN), agentKey...)}, Resource: []Statement{keyPolicyRoot}, ResourceMustAllow: true},
			req: Request{Action: "kms:Decrypt", Resource: keyARN, Known: kmsKnown,
				Context: map[string][]string{"kms:EncryptionContext:purpose": {"other"}, "kms:EncryptionContext:nodeId": {"n1"}}}},
		{name: "a key policy that does not delegate to IAM", pol: Policies{Identity: []Statement{allow(list("kms:Encrypt"), list(keyARN))}, ResourceMustAllow: true},
			req: Request{Action: "kms:Encrypt", Resource: keyARN}, wantReason: "neither allows it nor delegates"},
		{name: "a key policy that names the role allows alone", pol: Policies{Resource: []Statement{{Effect: "Allow", Action: list("kms:Encrypt"), Resource: list("*"), Principals: list(role), Policy: "KeyPolicy"}}, ResourceMustAllow: true},
			req: Request{Action: "kms:Encrypt", Resource: keyARN}, want: true},
		{name: "a key policy deny of the role", pol: Policies{Identity: []Statement{allow(list("kms:*"), list(keyARN))}, ResourceMustAllow: true, Resource: []Statement{keyPolicyRoot,
			{Sid: "ApiMayNotOpen", Effect: "Deny", Action: list("kms:Decrypt"), Resource: list("*"), Principals: list(role), Policy: "KeyPolicy"}}},
			req: Request{Action: "kms:Decrypt", Resource: keyARN}, wantReason: "explicitly denied by KeyPolicy/ApiMayNotOpen"},
		{name: "a key policy deny of another role", pol: Policies{Identity: []Statement{allow(list("kms:*"), list(keyARN))}, ResourceMustAllow: true, Resource: []Statement{keyPolicyRoot,
			{Sid: "ApiMayNotOpen", Effect: "Deny", Action: list("kms:Decrypt"), Resource: list("*"), Principals: list(other), Policy: "KeyPolicy"}}},
			req: Request{Action: "kms:Decrypt", Resource: keyARN}, want: true},
		{name: "a bus deny of everyone but the senders", pol: Policies{Identity: []Statement{allow(list("events:PutEvents"), list(busARN))}, Resource: []Statement{busDeny}},
			req:        Request{Action: "events:PutEvents", Resource: busARN, Context: map[string][]string{"events:source": {"openrelay.capacity"}}},
			wantReason: "explicitly denied by BusPolicy/OnlyItsSenders"},
		{name: "a sender the bus deny exempts", principalAR: other, pol: Policies{Identity: []Statement{allow(list("events:PutEvents"), list(busARN))}, Resource: []Statement{busDeny}},
			req: Request{Action: "events:PutEvents", Resource: busARN, Context: map[string][]string{"events:source": {"openrelay.capacity"}}}, want: true},
		{name: "source condition", pol: Policies{Identity: []Statement{allow(list("events:PutEvents"), list(busARN),
			Condition{Operator: "StringEquals", Key: "events:source", Values: list("openrelay.capacity")})}},
			req: Request{Action: "events:PutEvents", Resource: busARN, Context: map[string][]string{"events:source": {"openrelay.fleet"}}}},
		{name: "a service principal is not the role", pol: Policies{Resource: []Statement{{Effect: "Allow", Action: list("sqs:*"), Principals: list("service:events.amazonaws.com"), Policy: "Q"}}},
			req: Request{Action: "sqs:SendMessage", Resource: "arn:aws:sqs:us-east-1:000000000000:q"}},
		{name: "TLS-only queue policy", pol: Policies{Identity: []Statement{allow(list("sqs:ReceiveMessage"), list("*"))}, Resource: []Statement{{Effect: "Deny", Action: list("sqs:*"), Principals: list("*"), Policy: "Q",
			Conditions: []Condition{{Operator: "Bool", Key: "aws:SecureTransport", Values: list("false")}}}}},
			req: Request{Action: "sqs:ReceiveMessage", Resource: "arn:aws:sqs:us-east-1:000000000000:q"}, want: true},
		{name: "IfExists on an absent key", pol: Policies{Identity: []Statement{allow(list("iam:PassRole"), list(role),
			Condition{Operator: "StringEqualsIfExists", Key: "iam:PassedToService", Values: list("scheduler.amazonaws.com")})}},
			req: Request{Action: "iam:PassRole", Resource: role, Known: list("iam:PassedToService")}, want: true},
		{name: "an absent key fails a plain condition", pol: Policies{Identity: []Statement{allow(list("iam:PassRole"), list(role),
			Condition{Operator: "StringEquals", Key: "iam:PassedToService", Values: list("scheduler.amazonaws.com")})}},
			req: Request{Action: "iam:PassRole", Resource: role, Known: list("iam:PassedToService")}},
		{name: "an unmodelled key is undecidable, not guessed", pol: Policies{Identity: []Statement{allow(list("dynamodb:GetItem"), list(stateTable),
			Condition{Operator: "StringEquals", Key: "aws:SourceVpce", Values: list("vpce-1")})}},
			req: Request{Action: "dynamodb:GetItem", Resource: stateTable}, wantReason: "condition key aws:SourceVpce not modelled"},
		{name: "an unmodelled operator is undecidable", pol: Policies{Identity: []Statement{allow(list("dynamodb:GetItem"), list(stateTable),
			Condition{Operator: "NumericLessThan", Key: "dynamodb:LeadingKeys", Values: list("3")})}},
			req: Request{Action: "dynamodb:GetItem", Resource: stateTable, Context: leading("1")}, wantReason: "condition operator NumericLessThan not modelled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Principal{RoleARN: role, Account: account}
			if tc.principalAR != "" {
				p.RoleARN = tc.principalAR
			}
			d := Evaluate(p, tc.pol, tc.req)
			if d.Allowed != tc.want {
				t.Fatalf("allowed %v (%s), want %v", d.Allowed, d.Reason, tc.want)
			}
			if tc.wantReason != "" && !strings.Contains(d.Reason, tc.wantReason) {
				t.Errorf("reason %q, want it to say %q", d.Reason, tc.wantReason)
			}
		})
	}
}

func TestWildcard(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "anything/at:all", true},
		{"a*c", "abc", true},
		{"a*c", "ac", true},
		{"a*c", "acb", false},
		{"NODE#*#OP#*", "NODE#n1#OP#rcl_1", true},
		{"NODE#*#OP#*", "NODE#n1", false},
		{"NODE#*#OP#*", "NODE#n1#VM#v1", false},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"*/index/*", "table/t/index/i", true},
		{"x*y*z", "xaybz", true},
		{"x*y*z", "xazby", false},
		{"abc", "abc", true},
		{"abc", "abcd", false},
	}
	for _, tc := range tests {
		if got := wildcard(tc.pattern, tc.s); got != tc.want {
			t.Errorf("wildcard(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}
