package dynamo

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// renderItem writes an item as text, map members sorted, so that a test can pin its layout.
func renderItem(v types.AttributeValue) string {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return strconv.Quote(v.Value)
	case *types.AttributeValueMemberN:
		return "N" + v.Value
	case *types.AttributeValueMemberBOOL:
		return strconv.FormatBool(v.Value)
	case *types.AttributeValueMemberNULL:
		return "NULL"
	case *types.AttributeValueMemberL:
		var out []string
		for _, e := range v.Value {
			out = append(out, renderItem(e))
		}
		return "[" + strings.Join(out, ",") + "]"
	case *types.AttributeValueMemberM:
		var out []string
		for _, k := range slices.Sorted(maps.Keys(v.Value)) {
			out = append(out, k+":"+renderItem(v.Value[k]))
		}
		return "{" + strings.Join(out, ",") + "}"
	}
	return fmt.Sprintf("%T", v)
}

// TestAuditItemLayout pins the audit item attribute by attribute, nested ones included:
// items written before must decode as they did, and the same record must be written as it was.
func TestAuditItemLayout(t *testing.T) {
	withGrants := fullAudit
	withGrants.Grants = &capacity.KeyGrants{OrgID: "o", Permissions: []string{"p"}, Operator: true, ExpiresAt: &end, RateLimit: &capacity.RateLimit{PerSecond: 1.5, Burst: 3}}
	withGrants.Start = &capacity.ChainStart{Unchained: 2, Digest: "d"}
	const common = `ActingFor:"o",Action:"reclaim",ActorKeyID:"k",CallerOrgID:"o",DryRun:true,ID:"a",NodeID:"n1",Outcome:"ok",Reason:"r",` +
		`ReclaimID:"rcl_1",ReleasedAfter:[],ReleasedBefore:["u0"],RequestID:"q",ReservationID:"r1",Skipped:["v2"],Terminated:["v1"],` +
		`Time:"2026-11-01T00:00:00Z",TopologyGen:N2,UnitIDs:["u0"],VMID:"v1",eventId:"e1",`
	for _, tc := range []struct {
		name string
		rec  capacity.AuditRecord
		want string
	}{
		{"a reclaim", fullAudit, "{" + common + `hash:"h8",pk:"NODE#n1",prevHash:"h7",resKey:"NODE#n1#RES#r1",seq:N8,sk:"SEQ#00000000000000000008",` +
			`targetKeyId:"k2",type:"audit",via:"event",victims:[{orgId:"b",unitIds:["u0"],vmId:"v1"}]}`},
		{"grants and start", withGrants, "{" + common + `grants:{expiresAt:"2026-11-02T00:00:00Z",operator:true,orgId:"o",permissions:["p"],rateLimit:{burst:N3,perSecond:N1.5}},` +
			`hash:"h8",pk:"NODE#n1",prevHash:"h7",resKey:"NODE#n1#RES#r1",seq:N8,sk:"SEQ#00000000000000000008",` +
			`start:{digest:"d",unchained:N2},targetKeyId:"k2",type:"audit",via:"event",victims:[{orgId:"b",unitIds:["u0"],vmId:"v1"}]}`},
		{"unchained, nothing optional", capacity.AuditRecord{ID: "b", Time: at, NodeID: "n1", Grants: &capacity.KeyGrants{}},
			`{ActingFor:"",Action:"",ActorKeyID:"",CallerOrgID:"",DryRun:false,ID:"b",NodeID:"n1",Outcome:"",Reason:"",ReclaimID:"",` +
				`ReleasedAfter:NULL,ReleasedBefore:NULL,RequestID:"",ReservationID:"",Skipped:NULL,Terminated:NULL,Time:"2026-11-01T00:00:00Z",` +
				`TopologyGen:N0,UnitIDs:NULL,VMID:"",grants:{expiresAt:NULL,operator:false,orgId:"",permissions:NULL},pk:"NODE#n1",` +
				`sk:"2026-11-01T00:00:00Z#b",type:"audit"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			item, err := attributevalue.MarshalMap(newAuditItem(tc.rec))
			if err != nil {
				t.Fatal(err)
			}
			if got := renderItem(&types.AttributeValueMemberM{Value: item}); got != tc.want {
				t.Errorf("item\n got %s\nwant %s", got, tc.want)
			}
			var it auditItem
			if err := attributevalue.UnmarshalMap(item, &it); err != nil {
				t.Fatal(err)
			}
			if got := it.record(); !reflect.DeepEqual(got, tc.rec) {
				t.Errorf("decoded %+v, want %+v", got, tc.rec)
			}
		})
	}
}
