package capacity_test

import (
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/capacity"
)

func TestParseEventPrincipals(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    int    // principals parsed
		wantErr string // a substring of the error; "" for none
	}{
		{name: "empty list accepts none", json: `[]`, want: 0},
		{name: "a tenant and an operator", want: 2, json: `[
			{"source":"acme.automation","orgId":"org-acme","permissions":["reservation.capacity"]},
			{"source":"openrelay.fleet","orgId":"platform","operator":true,"permissions":["node.topology"]}]`},
		{name: "not a list", json: `{"source":"a.b"}`, wantErr: "JSON list"},
		{name: "unknown member", json: `[{"source":"a.b","orgId":"o","permissions":["reservation.capacity"],"senderRoles":[]}]`, wantErr: "unknown field"},
		{name: "a source twice", wantErr: "twice", json: `[
			{"source":"a.b","orgId":"o","permissions":["reservation.capacity"]},
			{"source":"a.b","orgId":"p","permissions":["reservation.capacity"]}]`},
		{name: "an AWS source", json: `[{"source":"aws.ec2","orgId":"o","permissions":["reservation.capacity"]}]`, wantErr: "not a custom"},
		{name: "the service's own source", json: `[{"source":"openrelay.capacity","orgId":"o","permissions":["reservation.capacity"]}]`, wantErr: "own source"},
		{name: "the schedules' source", json: `[{"source":"openrelay.capacity.schedule","orgId":"o","permissions":["reservation.capacity"]}]`, wantErr: "own source"},
		{name: "no org", json: `[{"source":"a.b","orgId":"","permissions":["reservation.capacity"]}]`, wantErr: "orgId"},
		{name: "no permission", json: `[{"source":"a.b","orgId":"o","operator":true,"permissions":[]}]`, wantErr: "grants nothing"},
		{name: "a permission events cannot use", json: `[{"source":"a.b","orgId":"o","permissions":["vm.place"]}]`, wantErr: "vm.place"},
		{name: "topology without operator", json: `[{"source":"a.b","orgId":"o","permissions":["node.topology"]}]`, wantErr: "set operator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := capacity.ParseEventPrincipals(tt.json)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
			case len(got) != tt.want:
				t.Fatalf("%d principals, want %d", len(got), tt.want)
			}
		})
	}
}

func TestEventPrincipalGrants(t *testing.T) {
	ps, err := capacity.ParseEventPrincipals(`[
		{"source":"acme.automation","orgId":"org-acme","permissions":["reservation.capacity"]},
		{"source":"openrelay.scheduler","orgId":"platform","operator":true,"permissions":["reservation.capacity"]},
		{"source":"openrelay.fleet","orgId":"platform","operator":true,"permissions":["node.topology"]}]`)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		source            string
		reclaim, topology bool
		operator          bool
		org               string
	}{
		{source: "acme.automation", reclaim: true, org: "org-acme"},
		{source: "openrelay.scheduler", reclaim: true, operator: true, org: "platform"},
		{source: "openrelay.fleet", topology: true, operator: true, org: "platform"},
	}
	for _, tt := range tests {
		p, ok := ps.Lookup(tt.source)
		if !ok {
			t.Fatalf("%s not found", tt.source)
		}
		pr := p.Principal()
		if p.CanReclaim() != tt.reclaim || p.CanChangeTopology() != tt.topology || pr.Operator != tt.operator ||
			pr.OrgID != tt.org || pr.KeyID != "event:"+tt.source {
			t.Errorf("%s: reclaim %v topology %v principal %+v", tt.source, p.CanReclaim(), p.CanChangeTopology(), pr)
		}
	}
	if _, ok := ps.Lookup("someone.else"); ok {
		t.Error("an unlisted source was found")
	}
}
