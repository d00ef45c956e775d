package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
)

// A node's resealed agent key (capacity.ResealedAgentKey) is an item of its own, NODE#<nodeId>
// / NODE#AGENTKEY, written only by the terminating function. Not an attribute of the node
// item: every capacity write updates that item, and the api function, which may write it,
// then could not be kept from dropping the resealed key with a whole-item write one day; an
// item of its own is left alone by every other write. Its sort key follows NODE, so the
// LoadNode Query reads it in the same call (no read more per termination round); only a Store
// with ReadResealedAgentKeys (the terminating function's) decodes it.
const (
	typeResealedAgentKey = "resealedagentkey"
	skResealedAgentKey   = "NODE#AGENTKEY"
)

type resealedAgentKeyItem struct {
	PK          string    `dynamodbav:"pk"`
	SK          string    `dynamodbav:"sk"`
	Type        string    `dynamodbav:"type"`
	NodeID      string    `dynamodbav:"NodeID"`
	AgentKeyGen int64     `dynamodbav:"AgentKeyGen"`
	Resealed    []byte    `dynamodbav:"Resealed"`
	At          time.Time `dynamodbav:"At"`
}

func (i resealedAgentKeyItem) resealed() *capacity.ResealedAgentKey {
	return &capacity.ResealedAgentKey{Gen: i.AgentKeyGen, Sealed: i.Resealed, At: i.At}
}

// PutResealedAgentKey stores r as node nodeID's resealed agent key, on the condition that no
// item of a later generation is there (a round that read the node before a rotation must not
// replace the new generation's): else an error wrapping capacity.ErrConflict.
func (s *Store) PutResealedAgentKey(ctx context.Context, nodeID string, r capacity.ResealedAgentKey) error {
	if !capacity.ValidID(nodeID) || r.Gen < 1 || len(r.Sealed) == 0 {
		return fmt.Errorf("put resealed agent key of node %q: invalid node id, generation %d or no key", nodeID, r.Gen)
	}
	item, err := attributevalue.MarshalMap(resealedAgentKeyItem{
		PK: nodePK(nodeID), SK: skResealedAgentKey, Type: typeResealedAgentKey,
		NodeID: nodeID, AgentKeyGen: r.Gen, Resealed: r.Sealed, At: r.At.UTC(),
	})
	if err != nil {
		return fmt.Errorf("encode resealed agent key of node %s: %w", nodeID, err)
	}
	cond := expression.Name(attrPK).AttributeNotExists().
		Or(expression.Name(attrAgentKeyGen).LessThanEqual(expression.Value(r.Gen)))
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("build resealed agent key condition: %w", err)
	}
	_, err = s.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(s.Table), Item: item, ConditionExpression: expr.Condition(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return fmt.Errorf("put resealed agent key of node %s, generation %d: a later generation's is stored: %w", nodeID, r.Gen, capacity.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("put resealed agent key of node %s: %w", nodeID, classify(err))
	}
	return nil
}

var _ capacity.ResealedAgentKeyStore = (*Store)(nil)
