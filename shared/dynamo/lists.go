package dynamo

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/table"
)

// The API's lists read the byList index (table.ByListIndex). Its entries are items in the
// partitions of what they point to, so no write spans nodes, and they sort before NODE, so a
// decision's query (sk >= NODE) never reads them and no commit conditions on them:
//
//	pk NODE#<n>  sk DIR           gsi2pk NODES             gsi2sk <n>  the directory of nodes
//	pk NODE#<n>  sk MEMBER#<org>  gsi2pk ORG#<org>#NODES   gsi2sk <n>  an org named on the node
//
// They are put unconditionally (idempotent) with the writes that make them true: the node's
// creation and every change of it (DIR, MEMBER of its owner), a reservation's creation (MEMBER
// of each of its orgs). A membership is never removed: the service checks each candidate on
// the node's own items (a former owner no longer sees it). Reclaim operations carry their
// list keys themselves (opListPK, opListSK).
//
// A membership put with a reservation's creation, in its transaction, lists the ids of every
// reservation of the node that names the org (ReservationIDs, from the decision's read, which
// the node's bumped version keeps complete), so that the org's list reads those alone. Any
// other put of it (a node's owner, one written ahead, the migration's) lists none, and the
// org's list then reads the node's partition as before: a list in an entry is never partial.

var _ capacity.NodeDirectory = (*Store)(nil)

const (
	typeDirectory = "directory"
	typeMember    = "member"
	skDirectory   = "DIR"
	prefixMember  = "MEMBER#"
	dirListPK     = "NODES"

	attrGSI2PK = "gsi2pk" // table.ByListPartitionKey
	attrGSI2SK = "gsi2sk" // table.ByListSortKey
)

// orgNodesPK is the list of the nodes an org is named on.
func orgNodesPK(orgID string) string { return "ORG#" + orgID + "#NODES" }

// opListPK is the list of a reservation's reclaim operations.
func opListPK(nodeID, reservationID string) string {
	return nodePK(nodeID) + "#RES#" + reservationID + "#OPS"
}

// opListTime is the fixed-width UTC form of an operation's creation in its list key, so that
// keys sort as times do (RFC 3339 with nanoseconds drops trailing zeros and would not).
const opListTime = "2006-01-02T15:04:05.000000000Z"

// opListSK orders an operation in its reservation's list: by creation, then id.
func opListSK(createdAt time.Time, opID string) string {
	return createdAt.UTC().Format(opListTime) + "#" + opID
}

// directoryItem is a node's directory entry: a copy of what the list shows of it.
type directoryItem struct {
	PK          string   `dynamodbav:"pk"`
	SK          string   `dynamodbav:"sk"`
	Type        string   `dynamodbav:"type"`
	GSI2PK      string   `dynamodbav:"gsi2pk"`
	GSI2SK      string   `dynamodbav:"gsi2sk"`
	ID          string   `dynamodbav:"ID"`
	OwnerOrgID  string   `dynamodbav:"OwnerOrgID"`
	UnitIDs     []string `dynamodbav:"UnitIDs"`
	TopologyGen int64    `dynamodbav:"TopologyGen"`
}

func newDirectoryItem(n capacity.Node) directoryItem {
	return directoryItem{PK: nodePK(n.ID), SK: skDirectory, Type: typeDirectory, GSI2PK: dirListPK, GSI2SK: n.ID,
		ID: n.ID, OwnerOrgID: n.OwnerOrgID, UnitIDs: n.UnitIDs, TopologyGen: n.TopologyGen}
}

// memberItem says that an org was named on a node, and may list the node's reservations
// that name it (see above).
type memberItem struct {
	PK             string   `dynamodbav:"pk"`
	SK             string   `dynamodbav:"sk"`
	Type           string   `dynamodbav:"type"`
	GSI2PK         string   `dynamodbav:"gsi2pk"`
	GSI2SK         string   `dynamodbav:"gsi2sk"`
	NodeID         string   `dynamodbav:"NodeID"`
	OrgID          string   `dynamodbav:"OrgID"`
	ReservationIDs []string `dynamodbav:"ReservationIDs,stringset,omitempty"`
}

// attrMemberIDs is memberItem.ReservationIDs.
const attrMemberIDs = "ReservationIDs"

// maxListedReservations bounds the ids an entry lists (an item holds at most 400 KB), and
// maxListedPerCommit those of a commit's entries together (a transaction holds at most 4 MB):
// an org over either gets an entry that lists none.
const (
	maxListedReservations = 2000
	maxListedPerCommit    = 10000
)

func newMemberItem(nodeID, orgID string) memberItem {
	return memberItem{PK: nodePK(nodeID), SK: prefixMember + orgID, Type: typeMember,
		GSI2PK: orgNodesPK(orgID), GSI2SK: nodeID, NodeID: nodeID, OrgID: orgID}
}

// listEntries are the list index entries an operator commit makes true: the directory entry
// of a node created or changed (a copy shown as it is, so only ever written with the change),
// and the memberships of its owner and of a new reservation's orgs, each org once (only
// candidates, checked when read, so they may also be written ahead: see putAhead).
func listEntries(c capacity.OperatorCommit) (dir, members []any) {
	var orgs []string
	if n := c.NewNode; n != nil {
		dir = append(dir, newDirectoryItem(*n))
		orgs = append(orgs, n.OwnerOrgID)
	}
	if r := c.NewReservation; r != nil {
		orgs = append(append(orgs, r.AllowedOrgIDs...), r.ManagingOrgIDs...)
	}
	slices.Sort(orgs)
	budget := maxListedPerCommit
	for _, org := range slices.Compact(orgs) {
		if org != "" {
			m := newMemberItem(c.Node.ID, org)
			if ids := c.OrgReservations[org]; len(ids) <= min(budget, maxListedReservations) {
				m.ReservationIDs, budget = ids, budget-len(ids)
			}
			members = append(members, m)
		}
	}
	return dir, members
}

// unlisted are the membership entries without their lists of ids: those written ahead of
// their commit, whose lists its node version would not keep complete.
func unlisted(members []any) []any {
	out := make([]any, 0, len(members))
	for _, v := range members {
		if m, ok := v.(memberItem); ok {
			m.ReservationIDs = nil
			v = m
		}
		out = append(out, v)
	}
	return out
}

// seedEntries are the list index entries of seeded nodes and reservations, each once.
func seedEntries(seed Seed) []any {
	var out []any
	seen := map[string]bool{}
	member := func(nodeID, org string) {
		if k := nodeID + "\x00" + org; !seen[k] {
			seen[k] = true
			out = append(out, newMemberItem(nodeID, org))
		}
	}
	for _, n := range seed.Nodes {
		out = append(out, newDirectoryItem(n))
		member(n.ID, n.OwnerOrgID)
	}
	for _, r := range seed.Reservations {
		for _, org := range append(slices.Clone(r.AllowedOrgIDs), r.ManagingOrgIDs...) {
			member(r.NodeID, org)
		}
	}
	return out
}

// putItems are unconditional Puts of the items into the state table, for a transaction.
func (s *Store) putItems(items []any) ([]types.TransactWriteItem, error) {
	out := make([]types.TransactWriteItem, 0, len(items))
	for _, v := range items {
		item, err := attributevalue.MarshalMap(v)
		if err != nil {
			return nil, fmt.Errorf("encode list entry: %w", err)
		}
		out = append(out, types.TransactWriteItem{Put: &types.Put{TableName: aws.String(s.Table), Item: item}})
	}
	return out, nil
}

// putAhead writes membership entries that do not fit in their commit's transaction before it,
// in transactions of their own: an entry whose commit then fails is harmless, as the service
// checks every candidate on the node's own items.
func (s *Store) putAhead(ctx context.Context, nodeID string, entries []types.TransactWriteItem) error {
	for chunk := range slices.Chunk(entries, MaxTransactItems) {
		if _, err := s.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: chunk}); err != nil {
			return fmt.Errorf("put list entries of node %s: %w", nodeID, classify(err))
		}
	}
	return nil
}

// DirectoryNodes reads the directory of nodes from the list index, in id order after afterID.
func (s *Store) DirectoryNodes(ctx context.Context, afterID string, limit int) ([]capacity.Node, bool, error) {
	var out []capacity.Node
	more, err := s.queryList(ctx, dirListPK, afterID, limit, func(item map[string]types.AttributeValue) error {
		var it directoryItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return fmt.Errorf("decode directory entry: %w", err)
		}
		out = append(out, capacity.Node{ID: it.ID, OwnerOrgID: it.OwnerOrgID, UnitIDs: it.UnitIDs, TopologyGen: it.TopologyGen})
		return nil
	})
	return out, more, err
}

// MemberNodeIDs reads the ids of the nodes the org is named on, in id order after afterID.
func (s *Store) MemberNodeIDs(ctx context.Context, orgID, afterID string, limit int) ([]string, bool, error) {
	var out []string
	more, err := s.queryList(ctx, orgNodesPK(orgID), afterID, limit, func(item map[string]types.AttributeValue) error {
		out = append(out, attr(item, attrGSI2SK))
		return nil
	})
	return out, more, err
}

// NamedOn reads the org's membership entry on the node with one strongly consistent GetItem
// of its key and its list of ids alone: the same one small read whether the node exists or
// not, when the org is not named there.
func (s *Store) NamedOn(ctx context.Context, nodeID, orgID string) (bool, []string, error) {
	out, err := s.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.Table), Key: itemKey(nodePK(nodeID), prefixMember+orgID), ConsistentRead: aws.Bool(true),
		ProjectionExpression:     aws.String("#pk, #ids"),
		ExpressionAttributeNames: map[string]string{"#pk": attrPK, "#ids": attrMemberIDs},
	})
	if err != nil {
		return false, nil, fmt.Errorf("read membership of org %s on node %s: %w", orgID, nodeID, classify(err))
	}
	if out.Item == nil {
		return false, nil, nil
	}
	capacity.CallStatsFrom(ctx).AddRead(1, ItemSize(out.Item))
	var it memberItem
	if err := attributevalue.UnmarshalMap(out.Item, &it); err != nil {
		return false, nil, fmt.Errorf("decode membership of org %s on node %s: %w", orgID, nodeID, err)
	}
	if len(it.ReservationIDs) == 0 {
		return true, nil, nil
	}
	slices.Sort(it.ReservationIDs) // a set comes back in no order
	return true, it.ReservationIDs, nil
}

// GetReservations reads the node's reservations of ids with strongly consistent
// BatchGetItems, in the order of ids; missing ones are left out.
func (s *Store) GetReservations(ctx context.Context, nodeID string, ids []string) ([]capacity.Reservation, error) {
	byID := make(map[string]capacity.Reservation, len(ids))
	stats := capacity.CallStatsFrom(ctx)
	keys := make([]map[string]types.AttributeValue, 0, len(ids))
	for _, id := range ids {
		keys = append(keys, itemKey(nodePK(nodeID), prefixReserv+id))
	}
	err := s.batchGet(ctx, s.Table, keys, "reservations of node "+nodeID, func(item map[string]types.AttributeValue) error {
		stats.AddRead(1, ItemSize(item))
		var it reservationItem
		if err := attributevalue.UnmarshalMap(item, &it); err != nil {
			return fmt.Errorf("decode reservation of node %s: %w", nodeID, err)
		}
		byID[it.ID] = it.reservation()
		return nil
	})
	if err != nil {
		return nil, err
	}
	rs := make([]capacity.Reservation, 0, len(byID))
	for _, id := range ids {
		if r, ok := byID[id]; ok {
			rs = append(rs, r)
		}
	}
	return rs, nil
}

// queryList reads up to limit entries of a node list (sort key: node id) after afterID, and
// whether more follow. The start is a key condition, not an ExclusiveStartKey: the emulator
// would start one that names no item from the top. Ids are of capacity.ValidID's characters,
// so the first id after x is x+"-" at the least, and every id sorts before "~".
func (s *Store) queryList(ctx context.Context, listPK, afterID string, limit int, add func(map[string]types.AttributeValue) error) (bool, error) {
	keyCond := expression.Key(attrGSI2PK).Equal(expression.Value(listPK))
	if afterID != "" {
		keyCond = keyCond.And(expression.Key(attrGSI2SK).Between(expression.Value(afterID+"-"), expression.Value("~")))
	}
	expr, err := expression.NewBuilder().WithKeyCondition(keyCond).Build()
	if err != nil {
		return false, fmt.Errorf("build list query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.Table), IndexName: aws.String(table.ByListIndex),
		KeyConditionExpression: expr.KeyCondition(), ExpressionAttributeNames: expr.Names(),
		ExpressionAttributeValues: expr.Values(), Limit: aws.Int32(int32(limit + 1)),
	}
	n := 0
	stats := capacity.CallStatsFrom(ctx)
	for {
		page, err := s.Client.Query(ctx, in)
		if err != nil {
			return false, fmt.Errorf("query list %s: %w", listPK, classify(err))
		}
		for _, item := range page.Items {
			stats.AddRead(1, ItemSize(item))
			if n == limit {
				return true, nil
			}
			if err := add(item); err != nil {
				return false, err
			}
			n++
		}
		if page.LastEvaluatedKey == nil {
			return false, nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
		in.Limit = aws.Int32(int32(limit + 1 - n))
	}
}

// listReadConcurrency bounds the operations of one page read at once.
const listReadConcurrency = 4

// ReservationOperations reads the reservation's reclaim operations newest first from the list
// index (eventually consistent: one just committed may take a moment to appear), in one of
// states (none: any), and then each whole, with its outcomes and notices, from its partition.
func (s *Store) ReservationOperations(ctx context.Context, nodeID, reservationID string, states []capacity.OperationState,
	before *capacity.OperationPosition, limit int) ([]capacity.Operation, bool, error) {
	listPK := opListPK(nodeID, reservationID)
	keyCond := expression.Key(attrGSI2PK).Equal(expression.Value(listPK))
	if before != nil {
		// Every list key sorts after "" and before the cursor's own.
		keyCond = keyCond.And(expression.Key(attrGSI2SK).LessThan(expression.Value(opListSK(before.CreatedAt, before.ID))))
	}
	b := expression.NewBuilder().WithKeyCondition(keyCond)
	if len(states) > 0 {
		rest := make([]expression.OperandBuilder, 0, len(states)-1)
		for _, st := range states[1:] {
			rest = append(rest, expression.Value(string(st)))
		}
		cond := expression.Name(attrState).In(expression.Value(string(states[0])), rest...)
		b = b.WithFilter(cond)
	}
	expr, err := b.Build()
	if err != nil {
		return nil, false, fmt.Errorf("build reclaim list query: %w", err)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.Table), IndexName: aws.String(table.ByListIndex),
		KeyConditionExpression: expr.KeyCondition(), FilterExpression: expr.Filter(),
		ExpressionAttributeNames: expr.Names(), ExpressionAttributeValues: expr.Values(),
		ScanIndexForward: aws.Bool(false), Limit: aws.Int32(int32(limit + 1)),
	}
	var ids []string
	more := false
	stats := capacity.CallStatsFrom(ctx)
	// A filtered page may come back short: read on until limit+1 entries or the end.
read:
	for {
		page, err := s.Client.Query(ctx, in)
		if err != nil {
			return nil, false, fmt.Errorf("query reclaims of reservation %s: %w", reservationID, classify(err))
		}
		for _, item := range page.Items {
			stats.AddRead(1, ItemSize(item))
			if len(ids) == limit {
				more = true
				break read
			}
			ids = append(ids, attr(item, "ID"))
		}
		if page.LastEvaluatedKey == nil {
			break
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
	ops := make([]capacity.Operation, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, listReadConcurrency)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			op, err := s.GetOperation(ctx, nodeID, id)
			if err != nil {
				errs[i] = err
				return
			}
			ops[i] = *op
		}()
	}
	wg.Wait()
	out := ops[:0]
	for i := range ops {
		switch {
		case capacity.ErrorCode(errs[i]) == capacity.CodeNotFound:
			continue // expired since the index was read
		case errs[i] != nil:
			return nil, false, errs[i]
		case len(states) > 0 && !slices.Contains(states, ops[i].State):
			continue // moved on since the index was read
		}
		out = append(out, ops[i])
	}
	return out, more, nil
}
