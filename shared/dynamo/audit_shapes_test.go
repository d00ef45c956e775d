package dynamo

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"

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
