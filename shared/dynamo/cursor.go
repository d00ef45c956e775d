package dynamo

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// The cursors of the lists read with an ExclusiveStartKey (the audit lists, a reservation's
// scheduled reclaims) are the key of the last item the page showed (no filter, so nothing
// unshown), made opaque: base64url (unpadded) of a JSON object of its string attributes.
// Every key attribute of our tables and indexes is a string, so nothing else needs encoding.
// A cursor carries no authority: the caller is checked on every page. But DynamoDB answers a
// start key that is not of the queried table's or index's key schema, or lies outside the
// query's partition, with a ValidationException (a 500, and an alarm): so decodeCursor takes
// only a key of the shape the list hands out, and anything else is the caller's 422.

// keyShape is the key a list's cursor must name: exactly these attributes, each value
// accepted by its check.
type keyShape map[string]func(string) bool

// equal accepts want only.
func equal(want string) func(string) bool { return func(v string) bool { return v == want } }

// isAuditSK accepts the sort key of an audit record: a chained one's SEQ#<20 digits>, or an
// unchained one's <RFC 3339 time>#<record id>.
func isAuditSK(v string) bool {
	if digits, ok := strings.CutPrefix(v, prefixSeq); ok {
		return len(digits) == 20 && strings.Trim(digits, "0123456789") == ""
	}
	at, id, ok := strings.Cut(v, "#")
	if _, err := time.Parse(time.RFC3339Nano, at); err != nil || !ok {
		return false
	}
	return id != "" && !strings.Contains(id, "#")
}

// encodeCursor returns the cursor of a LastEvaluatedKey; "" when there is no next page.
func encodeCursor(lek map[string]types.AttributeValue) (string, error) {
	if len(lek) == 0 {
		return "", nil
	}
	m := make(map[string]string, len(lek))
	for name, av := range lek {
		s, ok := av.(*types.AttributeValueMemberS)
		if !ok {
			return "", fmt.Errorf("encode cursor: key attribute %q is %T, not a string", name, av)
		}
		m[name] = s.Value
	}
	b, err := json.Marshal(m) // map keys are sorted: the same key gives the same cursor
	if err != nil {
		return "", fmt.Errorf("encode cursor: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeCursor returns the ExclusiveStartKey of cursor c; nil for "" (the first page). The
// key must have exactly the attributes of shape, each accepted by its check. Anything else,
// and garbage, is a *capacity.Error invalid_request "invalid cursor".
func decodeCursor(c string, shape keyShape) (map[string]types.AttributeValue, error) {
	if c == "" {
		return nil, nil
	}
	invalid := capacity.Errorf(capacity.CodeInvalidRequest, "invalid cursor")
	if len(c) > 4096 {
		return nil, invalid
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, invalid
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil || len(m) != len(shape) {
		return nil, invalid
	}
	lek := make(map[string]types.AttributeValue, len(m))
	for name, v := range m {
		if ok := shape[name]; ok == nil || !ok(v) {
			return nil, invalid
		}
		lek[name] = &types.AttributeValueMemberS{Value: v}
	}
	return lek, nil
}
