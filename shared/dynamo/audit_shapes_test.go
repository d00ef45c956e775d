package dynamo

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/wire"
)

// fillLeaves sets every leaf of v (strings, numbers, bools, times; nested structs, pointers
// and lists followed, lists given two elements) to a value of its own, so that a field one
// shape forgets shows up as a difference. Times are in UTC, as both forms read them back.
func fillLeaves(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillLeaves(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range v.Len() {
			fillLeaves(v.Index(i), n)
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 1, 0, 0, *n, *n*1001, time.UTC)))
			return
		}
		for i := range v.NumField() {
			fillLeaves(v.Field(i), n)
		}
	default:
		panic(fmt.Sprintf("fillLeaves: no value for a %s", v.Type()))
	}
}

// leafPaths names the leaves fillLeaves sets, in the order it sets them ("Victims[1].OrgID").
func leafPaths(t reflect.Type, path string) []string {
	switch t.Kind() {
	case reflect.Pointer:
		return leafPaths(t.Elem(), path)
	case reflect.Slice:
		return append(leafPaths(t.Elem(), path+"[0]"), leafPaths(t.Elem(), path+"[1]")...)
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			return []string{path}
		}
		var out []string
		for i := range t.NumField() {
			out = append(out, leafPaths(t.Field(i).Type, strings.TrimPrefix(path+"."+t.Field(i).Name, "."))...)
		}
		return out
	}
	return []string{path}
}

// leaf is the leaf at path in v; the zero Value when a pointer or list on the way is nil or
// short.
func leaf(v reflect.Value, path string) reflect.Value {
	for _, part := range strings.Split(path, ".") {
		name, index, _ := strings.Cut(strings.TrimSuffix(part, "]"), "[")
		if v = reflect.Indirect(v); !v.IsValid() {
			return v
		}
		v = v.FieldByName(name)
		if index != "" {
			if v = reflect.Indirect(v); v.Len() <= int(index[0]-'0') {
				return reflect.Value{}
			}
			v = v.Index(int(index[0] - '0'))
		}
	}
	return reflect.Indirect(v)
}

// leafDiffs names the leaves of the record that got does not hold as want does.
func leafDiffs(got, want capacity.AuditRecord) []string {
	var out []string
	for _, path := range leafPaths(reflect.TypeFor[capacity.AuditRecord](), "") {
		g, w := leaf(reflect.ValueOf(got), path), leaf(reflect.ValueOf(want), path)
		if g.IsValid() != w.IsValid() || (g.IsValid() && !reflect.DeepEqual(g.Interface(), w.Interface())) {
			out = append(out, fmt.Sprintf("%s: got %v, want %v", path, g, w))
		}
	}
	return out
}

// changeLeaf changes the leaf at path in v (addressable) to another non-zero value.
func changeLeaf(v reflect.Value, path string) {
	v = leaf(v, path)
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1000)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1000)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	default:
		v.Set(reflect.ValueOf(v.Interface().(time.Time).Add(time.Nanosecond)))
	}
}

// untaggedFields names the fields of t, and of the structs it holds, that name no attribute in
// a dynamodbav tag.
func untaggedFields(t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name := strings.TrimPrefix(path+"."+f.Name, ".")
		if tag, _, _ := strings.Cut(f.Tag.Get("dynamodbav"), ","); tag == "" {
			out = append(out, name)
		}
		out = append(out, untaggedFields(f.Type, name)...)
	}
	return out
}

func fullAuditRecord() capacity.AuditRecord {
	var r capacity.AuditRecord
	n := 0
	fillLeaves(reflect.ValueOf(&r).Elem(), &n)
	return r
}

// TestAuditRecordShapes ties the audit record's forms to the domain's record, field by field
// as reflection finds them (nested ones included): a field added to capacity.AuditRecord,
// or to a type it holds, that the audit item, the API's JSON or the hash does not carry
// fails here.
func TestAuditRecordShapes(t *testing.T) {
	full := fullAuditRecord()
	t.Run("storage", func(t *testing.T) {
		item, err := attributevalue.MarshalMap(newAuditItem(full))
		if err != nil {
			t.Fatal(err)
		}
		var it auditItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			t.Fatal(err)
		}
		if got := it.record(); !reflect.DeepEqual(got, full) {
			t.Errorf("through the audit item: %s", strings.Join(leafDiffs(got, full), "; "))
		}
	})
	t.Run("stored names", func(t *testing.T) {
		// The item stores the record as it is: every field names its attribute in a tag, so
		// that renaming a Go field renames nothing stored.
		for _, path := range untaggedFields(reflect.TypeFor[capacity.AuditRecord](), "") {
			t.Errorf("%s: no dynamodbav tag", path)
		}
	})
	t.Run("wire", func(t *testing.T) {
		data, err := json.Marshal(wire.AuditRecord(full))
		if err != nil {
			t.Fatal(err)
		}
		var j wire.AuditRecordJSON
		if err := json.Unmarshal(data, &j); err != nil {
			t.Fatal(err)
		}
		got, err := wire.AuditRecordFrom(j)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, full) {
			t.Errorf("through the API's JSON: %s", strings.Join(leafDiffs(got, full), "; "))
		}
		if capacity.HashAuditRecord(got) != capacity.HashAuditRecord(full) {
			t.Errorf("a client recomputes hash %s from the API's JSON; the record's is %s", capacity.HashAuditRecord(got), capacity.HashAuditRecord(full))
		}
	})
	t.Run("hash", func(t *testing.T) {
		base := capacity.HashAuditRecord(full)
		for _, path := range leafPaths(reflect.TypeFor[capacity.AuditRecord](), "") {
			if path == "Hash" { // the hash covers the record, not itself
				continue
			}
			r := fullAuditRecord()
			changeLeaf(reflect.ValueOf(&r), path)
			if capacity.HashAuditRecord(r) == base {
				t.Errorf("%s: not covered by the hash", path)
			}
		}
	})
}

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
