package dynamo

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

var (
	at  = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	end = at.Add(24 * time.Hour)

	fullNode = capacity.Node{ID: "n1", OwnerOrgID: "o", TopologyGen: 2, AgentEndpoint: "https://a", UnitIDs: []string{"u0"}, Version: 3,
		AuditHead: capacity.AuditHead{Seq: 7, Hash: "h7"}, AgentKeyGen: 2, AgentKey: []byte("sealed-2"), PrevAgentKey: []byte("sealed-1"), AgentKeyRotatedAt: at}
	fullRes = capacity.Reservation{ID: "r1", NodeID: "n1", AllowedOrgIDs: []string{"a"}, ReservedUnitIDs: []string{"u0"},
		ReleasedUnitIDs: []string{"u0"}, ManagingOrgIDs: []string{"m"}, StartsAt: at, EndsAt: &end, Status: capacity.StatusActive,
		ContractRef: "c", CreatedAt: at, UpdatedAt: at, Reason: "r", TopologyGen: 2, Version: 4}
	fullVM = capacity.VM{ID: "v1", NodeID: "n1", OrgID: "b", Tier: capacity.TierSpot, UnitIDs: []string{"u0"},
		State: capacity.VMTerminating, ReclaimID: "rcl_1", CreatedAt: at, UpdatedAt: at, Version: 2}
	fullOp = capacity.Operation{ID: "rcl_1", NodeID: "n1", ReservationID: "r1", State: capacity.OpTerminating,
		VMIDs: []string{"v1"}, UnitIDs: []string{"u0"}, ExecutionARN: "arn:x", Attempt: 2, Restarts: 1, Reason: "why",
		CreatedAt: at, UpdatedAt: at, TerminateAfter: at.Add(time.Minute), OwnerOrgID: "o",
		Victims: []capacity.Victim{{VMID: "v1", OrgID: "b", UnitIDs: []string{"u0"}}}}
	fullOutcome = capacity.VMOutcome{Outcome: capacity.OutcomeFailed, Error: "e", At: at, Attempt: 2}
	fullIdem    = capacity.IdempotencyRecord{Scope: "o#k", NodeID: "n1", Fingerprint: "f", Result: []byte("{}"), CreatedAt: at, ExpiresAt: end}
	fullKey     = capacity.APIKey{KeyID: "k", Hash: "h", OrgID: "o", Permissions: []string{"p"}, Operator: true, Revoked: true, ExpiresAt: &end}
	fullAudit   = capacity.AuditRecord{ID: "a", Time: at, RequestID: "q", ActorKeyID: "k", CallerOrgID: "o", ActingFor: "o",
		Action: "reclaim", NodeID: "n1", ReservationID: "r1", UnitIDs: []string{"u0"}, DryRun: true, Reason: "r",
		ReclaimID: "rcl_1", Terminated: []string{"v1"}, Skipped: []string{"v2"}, ReleasedBefore: []string{"u0"},
		ReleasedAfter: []string{}, TopologyGen: 2, VMID: "v1", Outcome: "ok", Via: "event", EventID: "e1",
		Victims: []capacity.Victim{{VMID: "v1", OrgID: "b", UnitIDs: []string{"u0"}}}, Seq: 8, PrevHash: "h7", Hash: "h8", TargetKeyID: "k2"}
)

// The stored schema is the item structs' tags, not the domain's Go field names: renaming a
// domain field must not change it. These are the attribute names every item type is stored
// with (the first layout's names, so items written then decode unchanged); changing one is a
// migration, not a refactoring.
func TestStoredAttributeNames(t *testing.T) {
	tests := []struct {
		name string
		item any
		want string
	}{
		{"node", newNodeItem(fullNode), "AgentEndpoint AgentKey AgentKeyGen AgentKeyRotatedAt AuditHead AuditSeq ID OwnerOrgID PrevAgentKey TopologyGen UnitIDs Version pk sk type"},
		{"reservation", newReservationItem(fullRes), "AllowedOrgIDs ContractRef CreatedAt EndsAt ID ManagingOrgIDs NodeID Reason ReleasedUnitIDs ReservedUnitIDs StartsAt Status TopologyGen UpdatedAt Version pk sk type"},
		{"live VM", newVMItem(fullVM), "CreatedAt ID NodeID OrgID ReclaimID State Tier UnitIDs UpdatedAt Version pk sk type"},
		{"terminated VM", newHistoryItem(fullVM, DefaultRetention), "CreatedAt ID NodeID OrgID ReclaimID State Tier UnitIDs UpdatedAt Version expiresAt pk sk type"},
		{"operation", newOperationItem(fullOp), "Attempt CreatedAt ExecutionARN ID NodeID Reason ReservationID Restarts State UnitIDs UpdatedAt VMIDs gsi1pk gsi1sk gsi2pk gsi2sk ownerOrgId pk sk terminateAfter type victims"},
		{"directory entry", newDirectoryItem(fullNode), "ID OwnerOrgID TopologyGen UnitIDs gsi2pk gsi2sk pk sk type"},
		{"membership", newMemberItem("n1", "o"), "NodeID OrgID gsi2pk gsi2sk pk sk type"},
		{"outcome", newOutcomeItem(fullOp, "v1", fullOutcome, DefaultRetention), "At Attempt Error Outcome ReclaimID VMID pk sk type"},
		{"success outcome", newOutcomeItem(fullOp, "v1", capacity.VMOutcome{Outcome: capacity.OutcomeTerminated, At: at, Attempt: 1}, DefaultRetention), "At Attempt Error Outcome ReclaimID VMID expiresAt pk sk type"},
		{"idempotency", newIdempotencyItem(fullIdem), "CreatedAt Fingerprint NodeID Result Scope expiresAt pk sk type"},
		{"API key", newAPIKeyItem(fullKey), "ExpiresAt Hash KeyID Operator OrgID Permissions Revoked pk sk type"},
		{"audit", newAuditItem(fullAudit), "ActingFor Action ActorKeyID CallerOrgID DryRun ID NodeID Outcome Reason ReclaimID ReleasedAfter ReleasedBefore RequestID ReservationID Skipped Terminated Time TopologyGen UnitIDs VMID eventId hash pk prevHash resKey seq sk targetKeyId type via victims"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := attributeNames(t, tt.item); got != tt.want {
				t.Errorf("attributes\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// Items the first layout wrote (the domain structs embedded under the key) decode to the same
// domain values through the explicit item structs.
func TestFirstLayoutItemsDecode(t *testing.T) {
	type key struct {
		PK   string `dynamodbav:"pk"`
		SK   string `dynamodbav:"sk"`
		Type string `dynamodbav:"type"`
	}
	old := func(v any) map[string]types.AttributeValue {
		item, err := attributevalue.MarshalMap(v)
		if err != nil {
			t.Fatal(err)
		}
		return item
	}
	decode := func(item map[string]types.AttributeValue, into any) {
		if err := attributevalue.UnmarshalMap(item, into); err != nil {
			t.Fatal(err)
		}
	}
	var n nodeItem
	firstNode := fullNode
	firstNode.AuditHead = capacity.AuditHead{} // no audit chain then
	nodeOld := old(struct {
		key
		capacity.Node
	}{key{"NODE#n1", "NODE", "node"}, firstNode})
	delete(nodeOld, "AuditHead") // a field the first layout's Node did not have
	decode(nodeOld, &n)
	var r reservationItem
	decode(old(struct {
		key
		capacity.Reservation
	}{key{"NODE#n1", "RES#r1", "reservation"}, fullRes}), &r)
	var v vmItem
	decode(old(struct {
		key
		capacity.VM
	}{key{"NODE#n1", "VM#v1", "vm"}, fullVM}), &v)
	withoutOutcomes := fullOp // and without what the first layout did not have
	withoutOutcomes.TerminateAfter, withoutOutcomes.OwnerOrgID, withoutOutcomes.Victims = time.Time{}, "", nil
	var o operationItem
	decode(old(struct {
		key
		GSI1PK string `dynamodbav:"gsi1pk"`
		capacity.Operation
	}{key{"NODE#n1", "OP#rcl_1", "operation"}, "OPSTATE#terminating", withoutOutcomes}), &o)
	var out outcomeItem
	decode(old(struct {
		key
		ReclaimID, VMID string
		capacity.VMOutcome
	}{key{"NODE#n1", "OP#rcl_1#VM#v1", "outcome"}, "rcl_1", "v1", fullOutcome}), &out)
	var k apiKeyItem
	decode(old(struct {
		key
		capacity.APIKey
	}{key{"APIKEY#h", "APIKEY", "apikey"}, fullKey}), &k)
	for _, c := range []struct{ got, want any }{
		{n.node(), firstNode}, {r.reservation(), fullRes}, {v.vm(), fullVM}, {o.operation(), withoutOutcomes},
		{out.outcome(), fullOutcome}, {k.apiKey(), fullKey},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("decoded %+v, want %+v", c.got, c.want)
		}
	}
}

func TestAttributeNamesMatchTheTables(t *testing.T) {
	for _, c := range [][2]string{
		{attrPK, table.PartitionKey}, {attrSK, table.SortKey}, {attrExpiresAt, table.TTLAttribute},
		{attrGSI1PK, table.ByStatePartitionKey}, {attrGSI1SK, table.ByStateSortKey},
	} {
		if c[0] != c[1] {
			t.Errorf("store attribute %q, table %q", c[0], c[1])
		}
	}
}

// Every key of the state table belongs to one node, and the decision partition's key
// condition (sk >= NODE) keeps the idempotency records out and the node, reservations and
// VMs in.
func TestKeysBelongToOneNode(t *testing.T) {
	for _, pk := range []string{nodePK("n-1.a"), histPK("n-1.a"), opPK("n-1.a", "rcl_x")} {
		if got := nodeOfPK(pk); got != "n-1.a" {
			t.Errorf("node of %s = %q", pk, got)
		}
	}
	if nodeOfPK(apiKeyPK("h")) != "" {
		t.Error("an API key belongs to no node")
	}
	for _, sk := range []string{skNode, prefixReserv + "r", prefixVM + "v"} {
		if sk < skNode {
			t.Errorf("%s sorts before %s: the decision query would miss it", sk, skNode)
		}
	}
	if prefixIdempotent+"zzz" >= skNode {
		t.Errorf("idempotency records sort at or after %s: the decision query would read them", skNode)
	}
}

func TestItemSize(t *testing.T) {
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	tests := []struct {
		name string
		item map[string]types.AttributeValue
		want int
	}{
		{"empty", map[string]types.AttributeValue{}, 0},
		{"string: name + UTF-8 bytes", map[string]types.AttributeValue{"pk": s("NODE#n1")}, 2 + 7},
		{"multi-byte string", map[string]types.AttributeValue{"a": s("é")}, 1 + 2},
		{"number: 2 digits per byte + 1", map[string]types.AttributeValue{"Version": n("12345")}, 7 + 3 + 1},
		{"number: zeros trimmed", map[string]types.AttributeValue{"n": n("1000")}, 1 + 1 + 1},
		{"number: decimal", map[string]types.AttributeValue{"n": n("-0.0125")}, 1 + 2 + 1},
		{"binary: raw bytes", map[string]types.AttributeValue{"b": &types.AttributeValueMemberB{Value: []byte("{}")}}, 1 + 2},
		{"bool and null: 1 byte", map[string]types.AttributeValue{"t": &types.AttributeValueMemberBOOL{Value: true}, "z": &types.AttributeValueMemberNULL{Value: true}}, 1 + 1 + 1 + 1},
		{"list: 3 + 1 per element", map[string]types.AttributeValue{"UnitIDs": &types.AttributeValueMemberL{Value: []types.AttributeValue{s("u0"), s("u10")}}}, 7 + 3 + (1 + 2) + (1 + 3)},
		{"empty list", map[string]types.AttributeValue{"l": &types.AttributeValueMemberL{}}, 1 + 3},
		{"map: 3 + 1 per element + names", map[string]types.AttributeValue{"m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"k": s("vv")}}}, 1 + 3 + 1 + 1 + 2},
		{"string set", map[string]types.AttributeValue{"ss": &types.AttributeValueMemberSS{Value: []string{"a", "bc"}}}, 2 + 3},
		{"number set: each number's size", map[string]types.AttributeValue{"ns": &types.AttributeValueMemberNS{Value: []string{"12345", "1000"}}}, 2 + 4 + 2},
		{"binary set: raw bytes", map[string]types.AttributeValue{"bs": &types.AttributeValueMemberBS{Value: [][]byte{[]byte("ab"), []byte("c")}}}, 2 + 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ItemSize(tt.item); got != tt.want {
				t.Errorf("itemSize = %d, want %d", got, tt.want)
			}
		})
	}
}

// attributeNames returns the names of the attributes item is stored with, sorted, spaced.
func attributeNames(t *testing.T, item any) string {
	t.Helper()
	av, err := attributevalue.MarshalMap(item)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(slices.Sorted(maps.Keys(av)), " ")
}
