// Package floor is the floor of a reclaim's cost, for benchmarks only: a Lambda handler that
// makes a reclaim's three SDK calls (the node partition's Query, the decision's
// TransactWriteItems, StartExecution) from inputs a benchmark precomputed from the product's
// own store, with no product logic in between. Deployed in env local only (see infra/).
package floor

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Request is one reclaim's three calls, as the floor function receives them in its body.
type Request struct {
	Query    Query    `json:"query"`
	Transact []Action `json:"transact"`
	Start    Start    `json:"start"`
}

// Query is a dynamodb.QueryInput (the fields the store sets).
type Query struct {
	TableName              string            `json:"tableName"`
	IndexName              *string           `json:"indexName,omitempty"`
	KeyConditionExpression *string           `json:"keyConditionExpression,omitempty"`
	FilterExpression       *string           `json:"filterExpression,omitempty"`
	ProjectionExpression   *string           `json:"projectionExpression,omitempty"`
	Names                  map[string]string `json:"names,omitempty"`
	Values                 map[string]Value  `json:"values,omitempty"`
	ConsistentRead         *bool             `json:"consistentRead,omitempty"`
	Limit                  *int32            `json:"limit,omitempty"`
	ScanIndexForward       *bool             `json:"scanIndexForward,omitempty"`
}

// Action is one item of a TransactWriteItems: exactly one of put, update, check, delete.
type Action struct {
	Kind                string            `json:"kind"` // put | update | check | delete
	TableName           string            `json:"tableName"`
	Key                 map[string]Value  `json:"key,omitempty"`
	Item                map[string]Value  `json:"item,omitempty"`
	UpdateExpression    *string           `json:"updateExpression,omitempty"`
	ConditionExpression *string           `json:"conditionExpression,omitempty"`
	Names               map[string]string `json:"names,omitempty"`
	Values              map[string]Value  `json:"values,omitempty"`
	// ReturnOnFailure is an update's ReturnValuesOnConditionCheckFailure (the node's update
	// returns the node when its version or audit head moved).
	ReturnOnFailure string `json:"returnOnFailure,omitempty"`
}

// Start is a StartExecution's name and input; the state machine is the function's own.
type Start struct {
	Name  string `json:"name"`
	Input string `json:"input"`
}

// Value is an AttributeValue in DynamoDB's JSON form ({"S":"x"}, {"L":[...]}, ...). Pointers
// keep an empty list, map or binary apart from an absent one.
type Value struct {
	S    *string           `json:"S,omitempty"`
	N    *string           `json:"N,omitempty"`
	B    *[]byte           `json:"B,omitempty"`
	BOOL *bool             `json:"BOOL,omitempty"`
	NULL *bool             `json:"NULL,omitempty"`
	M    *map[string]Value `json:"M,omitempty"`
	L    *[]Value          `json:"L,omitempty"`
	SS   []string          `json:"SS,omitempty"`
	NS   []string          `json:"NS,omitempty"`
	BS   [][]byte          `json:"BS,omitempty"`
}

// QueryOf encodes a Query input.
func QueryOf(in *dynamodb.QueryInput) (Query, error) {
	vals, err := valuesOf(in.ExpressionAttributeValues)
	if err != nil {
		return Query{}, fmt.Errorf("query values: %w", err)
	}
	return Query{
		TableName: aws.ToString(in.TableName), IndexName: in.IndexName,
		KeyConditionExpression: in.KeyConditionExpression, FilterExpression: in.FilterExpression,
		ProjectionExpression: in.ProjectionExpression, Names: in.ExpressionAttributeNames, Values: vals,
		ConsistentRead: in.ConsistentRead, Limit: in.Limit, ScanIndexForward: in.ScanIndexForward,
	}, nil
}

// Input decodes the Query input.
func (q Query) Input() (*dynamodb.QueryInput, error) {
	vals, err := attrsOf(q.Values)
	if err != nil {
		return nil, fmt.Errorf("query values: %w", err)
	}
	return &dynamodb.QueryInput{
		TableName: aws.String(q.TableName), IndexName: q.IndexName,
		KeyConditionExpression: q.KeyConditionExpression, FilterExpression: q.FilterExpression,
		ProjectionExpression: q.ProjectionExpression, ExpressionAttributeNames: q.Names, ExpressionAttributeValues: vals,
		ConsistentRead: q.ConsistentRead, Limit: q.Limit, ScanIndexForward: q.ScanIndexForward,
	}, nil
}

// TransactOf encodes a TransactWriteItems input's items.
func TransactOf(in *dynamodb.TransactWriteItemsInput) ([]Action, error) {
	out := make([]Action, 0, len(in.TransactItems))
	for i, it := range in.TransactItems {
		var (
			a            Action
			key, item, v map[string]types.AttributeValue
		)
		switch {
		case it.Put != nil:
			p := it.Put
			a = Action{Kind: "put", TableName: aws.ToString(p.TableName), ConditionExpression: p.ConditionExpression, Names: p.ExpressionAttributeNames}
			item, v = p.Item, p.ExpressionAttributeValues
		case it.Update != nil:
			u := it.Update
			a = Action{Kind: "update", TableName: aws.ToString(u.TableName), UpdateExpression: u.UpdateExpression,
				ConditionExpression: u.ConditionExpression, Names: u.ExpressionAttributeNames,
				ReturnOnFailure: string(u.ReturnValuesOnConditionCheckFailure)}
			key, v = u.Key, u.ExpressionAttributeValues
		case it.ConditionCheck != nil:
			c := it.ConditionCheck
			a = Action{Kind: "check", TableName: aws.ToString(c.TableName), ConditionExpression: c.ConditionExpression, Names: c.ExpressionAttributeNames}
			key, v = c.Key, c.ExpressionAttributeValues
		case it.Delete != nil:
			d := it.Delete
			a = Action{Kind: "delete", TableName: aws.ToString(d.TableName), ConditionExpression: d.ConditionExpression, Names: d.ExpressionAttributeNames}
			key, v = d.Key, d.ExpressionAttributeValues
		default:
			return nil, fmt.Errorf("transact item %d: no action", i)
		}
		var err error
		if a.Key, err = valuesOf(key); err == nil {
			if a.Item, err = valuesOf(item); err == nil {
				a.Values, err = valuesOf(v)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("transact item %d: %w", i, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// TransactInput decodes the items into a TransactWriteItems input.
func TransactInput(actions []Action) (*dynamodb.TransactWriteItemsInput, error) {
	in := &dynamodb.TransactWriteItemsInput{TransactItems: make([]types.TransactWriteItem, 0, len(actions))}
	for i, a := range actions {
		key, err := attrsOf(a.Key)
		if err != nil {
			return nil, fmt.Errorf("transact item %d key: %w", i, err)
		}
		item, err := attrsOf(a.Item)
		if err != nil {
			return nil, fmt.Errorf("transact item %d: %w", i, err)
		}
		vals, err := attrsOf(a.Values)
		if err != nil {
			return nil, fmt.Errorf("transact item %d values: %w", i, err)
		}
		tbl := aws.String(a.TableName)
		var it types.TransactWriteItem
		switch a.Kind {
		case "put":
			it.Put = &types.Put{TableName: tbl, Item: item, ConditionExpression: a.ConditionExpression,
				ExpressionAttributeNames: a.Names, ExpressionAttributeValues: vals}
		case "update":
			it.Update = &types.Update{TableName: tbl, Key: key, UpdateExpression: a.UpdateExpression,
				ConditionExpression: a.ConditionExpression, ExpressionAttributeNames: a.Names, ExpressionAttributeValues: vals,
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailure(a.ReturnOnFailure)}
		case "check":
			it.ConditionCheck = &types.ConditionCheck{TableName: tbl, Key: key, ConditionExpression: a.ConditionExpression,
				ExpressionAttributeNames: a.Names, ExpressionAttributeValues: vals}
		case "delete":
			it.Delete = &types.Delete{TableName: tbl, Key: key, ConditionExpression: a.ConditionExpression,
				ExpressionAttributeNames: a.Names, ExpressionAttributeValues: vals}
		default:
			return nil, fmt.Errorf("transact item %d: unknown kind %q", i, a.Kind)
		}
		in.TransactItems = append(in.TransactItems, it)
	}
	return in, nil
}

func valuesOf(m map[string]types.AttributeValue) (map[string]Value, error) {
	if m == nil {
		return nil, nil
	}
	out := make(map[string]Value, len(m))
	for k, av := range m {
		v, err := valueOf(av)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

func valueOf(av types.AttributeValue) (Value, error) {
	switch a := av.(type) {
	case *types.AttributeValueMemberS:
		return Value{S: aws.String(a.Value)}, nil
	case *types.AttributeValueMemberN:
		return Value{N: aws.String(a.Value)}, nil
	case *types.AttributeValueMemberB:
		b := a.Value
		return Value{B: &b}, nil
	case *types.AttributeValueMemberBOOL:
		return Value{BOOL: aws.Bool(a.Value)}, nil
	case *types.AttributeValueMemberNULL:
		return Value{NULL: aws.Bool(a.Value)}, nil
	case *types.AttributeValueMemberSS:
		return Value{SS: a.Value}, nil
	case *types.AttributeValueMemberNS:
		return Value{NS: a.Value}, nil
	case *types.AttributeValueMemberBS:
		return Value{BS: a.Value}, nil
	case *types.AttributeValueMemberM:
		m, err := valuesOf(a.Value)
		if err != nil {
			return Value{}, err
		}
		if m == nil {
			m = map[string]Value{}
		}
		return Value{M: &m}, nil
	case *types.AttributeValueMemberL:
		l := make([]Value, 0, len(a.Value))
		for i, e := range a.Value {
			v, err := valueOf(e)
			if err != nil {
				return Value{}, fmt.Errorf("element %d: %w", i, err)
			}
			l = append(l, v)
		}
		return Value{L: &l}, nil
	}
	return Value{}, fmt.Errorf("unsupported attribute value %T", av)
}

func attrsOf(m map[string]Value) (map[string]types.AttributeValue, error) {
	if m == nil {
		return nil, nil
	}
	out := make(map[string]types.AttributeValue, len(m))
	for k, v := range m {
		av, err := v.attr()
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", k, err)
		}
		out[k] = av
	}
	return out, nil
}

func (v Value) attr() (types.AttributeValue, error) {
	switch {
	case v.S != nil:
		return &types.AttributeValueMemberS{Value: *v.S}, nil
	case v.N != nil:
		return &types.AttributeValueMemberN{Value: *v.N}, nil
	case v.B != nil:
		return &types.AttributeValueMemberB{Value: *v.B}, nil
	case v.BOOL != nil:
		return &types.AttributeValueMemberBOOL{Value: *v.BOOL}, nil
	case v.NULL != nil:
		return &types.AttributeValueMemberNULL{Value: *v.NULL}, nil
	case v.SS != nil:
		return &types.AttributeValueMemberSS{Value: v.SS}, nil
	case v.NS != nil:
		return &types.AttributeValueMemberNS{Value: v.NS}, nil
	case v.BS != nil:
		return &types.AttributeValueMemberBS{Value: v.BS}, nil
	case v.M != nil:
		m, err := attrsOf(*v.M)
		if err != nil {
			return nil, err
		}
		if m == nil {
			m = map[string]types.AttributeValue{}
		}
		return &types.AttributeValueMemberM{Value: m}, nil
	case v.L != nil:
		l := make([]types.AttributeValue, 0, len(*v.L))
		for i, e := range *v.L {
			av, err := e.attr()
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			l = append(l, av)
		}
		return &types.AttributeValueMemberL{Value: l}, nil
	}
	return nil, fmt.Errorf("empty attribute value")
}
