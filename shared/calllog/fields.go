package calllog

import (
	"reflect"
	"strconv"
	"strings"

	"github.com/openrelay/capacity/shared/table"
)

// resourceFields are the input fields (at any depth) that name what a call acts on, or that
// IAM conditions read: a string field with one of these names is recorded.
var resourceFields = map[string]bool{
	"TableName": true, "IndexName": true, // DynamoDB
	"StateMachineArn": true, "ExecutionArn": true, // Step Functions
	"EventBusName": true, "Source": true, "DetailType": true, // EventBridge
	"KeyId":     true,                                             // KMS
	"SecretId":  true,                                             // Secrets Manager
	"GroupName": true, "Name": true, "RoleArn": true, "Arn": true, // Scheduler (and its target)
	"QueueUrl": true, "FunctionName": true, // SQS, Lambda
	"KeyConditionExpression": true, // a Query's partition, for dynamodb:LeadingKeys
}

// Fields returns input's resource fields by path: field names joined with ".", with the index
// of a list element ("TransactItems.0.Put.TableName"). Besides resourceFields it keeps the
// entries of EncryptionContext and ExpressionAttributeNames maps, the partition key
// (table.PartitionKey) of Key and Item maps and of a batch's Keys (under RequestItems.<table>),
// and the ExpressionAttributeValues that a
// KeyConditionExpression beside them names. Byte slices and every other field are left out.
func Fields(input any) map[string]string {
	out := map[string]string{}
	walk(reflect.ValueOf(input), "", out)
	if len(out) == 0 {
		return nil
	}
	return out
}

func walk(v reflect.Value, path string, out map[string]string) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walk(v.Elem(), path, out)
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return // payloads: plaintexts, ciphertexts
		}
		for i := range v.Len() {
			walk(v.Index(i), path+strconv.Itoa(i)+".", out)
		}
	case reflect.Struct:
		walkStruct(v, path, out)
	}
}

func walkStruct(v reflect.Value, path string, out map[string]string) {
	t := v.Type()
	keyCondition := ""
	if f := v.FieldByName("KeyConditionExpression"); f.IsValid() {
		keyCondition, _ = stringValue(f)
	}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		f, name := v.Field(i), sf.Name
		if resourceFields[name] {
			if s, ok := stringValue(f); ok {
				out[path+name] = s
				continue
			}
		}
		if f.Kind() == reflect.Map && f.Type().Key().Kind() == reflect.String {
			switch name {
			case "EncryptionContext", "ExpressionAttributeNames":
				mapEntries(f, path+name+".", out, func(string) bool { return true })
			case "Key", "Item":
				mapEntries(f, path+name+".", out, func(k string) bool { return k == table.PartitionKey })
			case "RequestItems":
				// A batch's tables by name ("RequestItems.<table>.Keys.0.pk").
				for _, k := range f.MapKeys() {
					walk(f.MapIndex(k), path+name+"."+k.String()+".", out)
				}
			case "ExpressionAttributeValues":
				if keyCondition != "" {
					mapEntries(f, path+name+".", out, func(k string) bool { return strings.Contains(keyCondition, k) })
				}
			}
			continue
		}
		if name == "Keys" && f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Map {
			// A BatchGetItem's keys: the partition key of each.
			for i := range f.Len() {
				mapEntries(f.Index(i), path+name+"."+strconv.Itoa(i)+".", out, func(k string) bool { return k == table.PartitionKey })
			}
			continue
		}
		walk(f, path+name+".", out)
	}
}

// mapEntries records the string (or DynamoDB S or N) values of the entries keep accepts.
func mapEntries(m reflect.Value, path string, out map[string]string, keep func(string) bool) {
	for _, k := range m.MapKeys() {
		if !keep(k.String()) {
			continue
		}
		if s, ok := stringValue(m.MapIndex(k)); ok {
			out[path+k.String()] = s
		}
	}
}

// stringValue reads a string, a *string, or a DynamoDB attribute value holding one (its
// member struct's Value).
func stringValue(v reflect.Value) (string, bool) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", false
		}
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		v = v.FieldByName("Value")
	}
	if v.Kind() != reflect.String {
		return "", false
	}
	return v.String(), true
}
