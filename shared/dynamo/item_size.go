package dynamo

import (
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ItemSize is an item's size by DynamoDB's rules (what read and write units are charged on):
// attribute names plus values; numbers by significant digits; lists and maps 3 bytes plus
// 1 per element.
func ItemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return numberSize(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberSS:
		return sizeOfSet(v.Value, func(s string) int { return len(s) })
	case *types.AttributeValueMemberNS:
		return sizeOfSet(v.Value, numberSize)
	case *types.AttributeValueMemberBS:
		return sizeOfSet(v.Value, func(b []byte) int { return len(b) })
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += 1 + len(k) + valueSize(e)
		}
		return n
	}
	return 0
}

// sizeOfSet is a set's size: its members' sizes, with nothing for the set itself.
func sizeOfSet[T any](members []T, size func(T) int) int {
	n := 0
	for _, m := range members {
		n += size(m)
	}
	return n
}

// numberSize: 1 byte per two significant digits (leading and trailing zeros trimmed) plus 1.
func numberSize(s string) int {
	s = strings.TrimLeft(s, "+-")
	mant, _, _ := strings.Cut(strings.ToLower(s), "e")
	digits := strings.Replace(mant, ".", "", 1)
	digits = strings.TrimLeft(digits, "0")
	if strings.Contains(mant, ".") || strings.HasSuffix(digits, "0") {
		digits = strings.TrimRight(digits, "0")
	}
	return (len(digits)+1)/2 + 1
}
