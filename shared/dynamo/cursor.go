package dynamo

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// The audit lists' cursors are the LastEvaluatedKey of their Query, which is the key of the
// last record the page showed (no filter, so nothing unshown), made opaque: base64url
// (unpadded) of a JSON object of its string attributes. Every key attribute of our tables and
// indexes is a string, so nothing else needs encoding. A cursor carries no authority: the
// caller is checked on every page, and decodeCursor refuses one naming another partition, so a
// cursor can never widen what a query reads.

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

// decodeCursor returns the ExclusiveStartKey of cursor c; nil for "" (the first page). When
// wantPK is not empty the cursor must name that partition (attribute pk). Anything else, and
// garbage, is a *capacity.Error invalid_request "invalid cursor".
func decodeCursor(c, wantPK string) (map[string]types.AttributeValue, error) {
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
	if err := json.Unmarshal(b, &m); err != nil || len(m) == 0 {
		return nil, invalid
	}
	if wantPK != "" && m[attrPK] != wantPK {
		return nil, invalid
	}
	lek := make(map[string]types.AttributeValue, len(m))
	for name, v := range m {
		if name == "" || v == "" {
			return nil, invalid
		}
		lek[name] = &types.AttributeValueMemberS{Value: v}
	}
	return lek, nil
}
