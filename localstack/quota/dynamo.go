package quota

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"regexp"
	"strings"
)

// Table is a DynamoDB table as the template defines it: what keys its partitions.
type Table struct {
	Name         string
	PartitionKey string // attribute name of the hash key
	Provisioned  bool   // PROVISIONED billing: throttles answer ProvisionedThroughputExceededException
	Indexes      []Index
}

// Index is a global secondary index: a table of its own, partitioned by its own key.
type Index struct {
	Name         string
	PartitionKey string
	KeysOnly     bool // projection KEYS_ONLY: an index entry costs one unit whatever the item's size
}

// charge is what one action of a request costs against one partition (or a table's warm
// throughput): action is its place in a transaction (0 outside one).
type charge struct {
	id     ID
	action int
	bucket *Bucket
	cost   float64
}

// ddbRequest is the part of a DynamoDB request the model reads.
type ddbRequest struct {
	TableName                 string
	IndexName                 string
	Key                       map[string]any
	Item                      map[string]any
	UpdateExpression          string
	KeyConditionExpression    string
	ExpressionAttributeNames  map[string]string
	ExpressionAttributeValues map[string]any
	ConsistentRead            bool
	TransactItems             []map[string]ddbRequest
	RequestItems              map[string]json.RawMessage
}

// writeUnits is a write's WCU: one per KB of the item, rounded up, at least one.
func writeUnits(size int) float64 { return math.Max(1, math.Ceil(float64(size)/1024)) }

// keyValue is the partition-key value of an attribute value ("S:abc"), "" if absent.
func keyValue(av any) string {
	m, ok := av.(map[string]any)
	if !ok {
		return ""
	}
	for _, t := range []string{"S", "N", "B"} {
		if v, ok := m[t].(string); ok {
			return t + ":" + v
		}
	}
	return ""
}

// itemSize approximates DynamoDB's item size: attribute names plus values (strings and
// numbers by length, binaries decoded, sets and documents summed).
func itemSize(item map[string]any) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(av any) int {
	m, ok := av.(map[string]any)
	if !ok {
		return 0
	}
	n := 0
	for t, v := range m {
		switch t {
		case "S", "N":
			s, _ := v.(string)
			n += len(s)
		case "B":
			s, _ := v.(string)
			b, _ := base64.StdEncoding.DecodeString(s)
			n += len(b)
		case "BOOL", "NULL":
			n++
		case "SS", "NS", "BS":
			l, _ := v.([]any)
			for _, e := range l {
				s, _ := e.(string)
				n += len(s)
			}
		case "L":
			l, _ := v.([]any)
			n += 3
			for _, e := range l {
				n += 1 + valueSize(e)
			}
		case "M":
			mm, _ := v.(map[string]any)
			n += 3 + itemSize(mm)
		}
	}
	return n
}

// setValues maps each attribute an UpdateExpression's SET clause assigns a plain value
// (":v", or the value of if_not_exists(a, :v)) to that value. AWS keys an updated item's index
// entry by the new value of the index key; the expression is where the request carries it.
func setValues(expr string, names map[string]string, values map[string]any) map[string]any {
	out := map[string]any{}
	set := setClause(expr)
	for _, action := range splitTop(set) {
		path, val, ok := strings.Cut(action, "=")
		if !ok {
			continue
		}
		path, val = strings.TrimSpace(path), strings.TrimSpace(val)
		if n, ok := names[path]; ok {
			path = n
		}
		if m := ifNotExists.FindStringSubmatch(val); m != nil {
			val = m[1]
		}
		if v, ok := values[val]; ok {
			out[path] = v
		}
	}
	return out
}

var (
	clauseWord  = regexp.MustCompile(`(?i)\b(SET|REMOVE|ADD|DELETE)\b`)
	ifNotExists = regexp.MustCompile(`^if_not_exists\s*\([^,]+,\s*(:\w+)\s*\)$`)
	keyCond     = regexp.MustCompile(`(#?[\w.]+)\s*=\s*(:\w+)`)
)

// setClause returns the text of an update expression's SET clause.
func setClause(expr string) string {
	locs := clauseWord.FindAllStringSubmatchIndex(expr, -1)
	for i, l := range locs {
		if strings.EqualFold(expr[l[2]:l[3]], "SET") {
			end := len(expr)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			return expr[l[1]:end]
		}
	}
	return ""
}

// splitTop splits s at the commas outside parentheses.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if strings.TrimSpace(s[start:]) != "" {
		out = append(out, s[start:])
	}
	return out
}

// queryPartition is the partition-key value a KeyConditionExpression asks for.
func queryPartition(expr, keyAttr string, names map[string]string, values map[string]any) string {
	for _, m := range keyCond.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		if n, ok := names[name]; ok {
			name = n
		}
		if name == keyAttr {
			return keyValue(values[m[2]])
		}
	}
	return ""
}
