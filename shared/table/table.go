// Package table is the single description of the service's DynamoDB tables. The CDK stack
// (infra/) builds the tables from it, the store (shared/dynamo) reads and writes items by it,
// and the local stack provisions whatever the synthesised template says, which comes from here.
//
// It imports nothing so that the CDK module can depend on it without pulling in the AWS SDK.
package table

import "github.com/openrelay/capacity/shared/stackname"

// Key attribute names shared by every table.
const (
	PartitionKey = "pk"
	SortKey      = "sk"
	// TTLAttribute holds an epoch-seconds expiry; DynamoDB deletes the item some time after it.
	TTLAttribute = "expiresAt"
)

// OperationPartitions matches (as an IAM StringLike pattern) the partition key of every
// reclaim operation item and its outcomes, NODE#<nodeId>#OP#<operationId>, and no other
// item's: ids hold no '#', so a node, its history or its reservations never match. IAM's
// dynamodb:LeadingKeys condition keeps the reconciler to these partitions.
const OperationPartitions = "NODE#*#OP#*"

// NodePartitions matches every partition key under a node, NODE#<nodeId> and the ones that
// extend it (NODE#<nodeId>#OP#..., #HIST, #CALLS, #SCHED#...); NodeSubPartitions matches only
// the extended ones. Ids hold no '#', so allowing the first and denying the second leaves a
// node's decision partition (its node, reservation, VM and idempotency items) alone: the
// api role deletes there only (a force-end's VM).
const (
	NodePartitions    = "NODE#*"
	NodeSubPartitions = "NODE#*#*"
)

// Secondary index on the state table: items that must be found without knowing their own
// partition: reclaim operations by state (the reconciler: e.g. those still waiting for their
// workflow to start), and a reservation's scheduled reclaims (the api: their list).
const (
	ByStateIndex        = "byState"
	ByStatePartitionKey = "gsi1pk"
	ByStateSortKey      = "gsi1sk"
)

// Sparse secondary index on the state table for the API's lists, whose entries live in the
// partitions of the items they point to (so no write spans nodes): each node's directory
// entry (gsi2pk NODES, gsi2sk <nodeId>: every node, for operators), each org's membership
// entries (gsi2pk ORG#<orgId>#NODES, gsi2sk <nodeId>: the nodes it owns or holds a
// reservation on), and each reclaim operation (gsi2pk NODE#<nodeId>#RES#<reservationId>#OPS,
// gsi2sk <createdAt, fixed-width UTC>#<operationId>: a reservation's reclaims, newest first).
const (
	ByListIndex        = "byList"
	ByListPartitionKey = "gsi2pk"
	ByListSortKey      = "gsi2sk"
)

// Secondary index on the audit table: one reservation's records, newest first (sk orders
// them: chained records by seq, after the unchained ones keyed by time).
const (
	AuditByReservationIndex = "byReservation"
	// AuditByReservationKey holds NODE#<nodeId>#RES#<reservationId> on records about a
	// reservation, with #CALLS after it on those of the node's calls chain.
	AuditByReservationKey = "resKey"
)

// Table describes one table.
type Table struct {
	// LogicalID is the CloudFormation logical id prefix of the table in the stack.
	LogicalID string
	// Suffix completes the physical name: "capacity-<env>-<suffix>".
	Suffix string
	// Indexes lists the global secondary indexes (string keys).
	Indexes []Index
	// TTL says whether TTLAttribute is enabled on the table.
	TTL bool
}

// Index is a global secondary index with string partition and sort keys.
type Index struct {
	Name, PartitionKey, SortKey string
	// KeysOnly: it projects the table's and its own keys only (KEYS_ONLY), not every
	// attribute (ALL); its readers read the items from the table by key.
	KeysOnly bool
}

// State holds nodes, reservations, VMs, reclaim operations and idempotency records. Every key
// belongs to one node (pk NODE#<nodeId>, or NODE#<nodeId>#... for its history and its
// operations), so no write spans nodes; history expires through TTLAttribute. API keys live
// in Keys, out of reach of every function but the api function.
var State = Table{
	LogicalID: "StateTable",
	Suffix:    "state",
	Indexes: []Index{
		{Name: ByStateIndex, PartitionKey: ByStatePartitionKey, SortKey: ByStateSortKey},
		{Name: ByListIndex, PartitionKey: ByListPartitionKey, SortKey: ByListSortKey},
	},
	TTL: true,
}

// Audit is append-only: the functions may put items and never update or delete them. A node's
// records are in its partition (NODE#<nodeId>), the keys' in APIKEYS; chained records sort
// under SEQ#<20-digit seq>, unchained and earlier ones under <time>#<id> (before SEQ#). The
// heads of the chains are on the node items and in Keys.
var Audit = Table{
	LogicalID: "AuditTable",
	Suffix:    "audit",
	// A reservation's trail is read rarely, and its records stay for good: the index holds
	// their keys only, rather than a second copy of each.
	Indexes: []Index{{Name: AuditByReservationIndex, PartitionKey: AuditByReservationKey, SortKey: SortKey, KeysOnly: true}},
}

// Keys holds API keys by the hash of their secret, their id pointers, the idempotency records
// of key creations and the head of the keys' audit chain. It is a table of its own so that
// IAM can keep every other function away from it: only the api function reaches it (GetItem,
// PutItem, UpdateItem, ConditionCheckItem and Scan: key lookups, last use, and key management
// by operators), and reclaim-events reads it (GetItem only: a scheduled reclaim's firing checks
// its creator's key); the first operator key is created with AWS credentials outside the functions.
var Keys = Table{
	LogicalID: "KeysTable",
	Suffix:    "keys",
}

// Limits holds one item per API key, its rate limiter's state (pk KEY#<keyId>, sk RATE: the
// key's theoretical arrival time, GCRA), apart from every node partition and from the keys:
// no decision reads it, no commit conditions on it, and only the api function may write it,
// by UpdateItem alone. Items expire by TTL once long idle, when they are as good as absent.
var Limits = Table{
	LogicalID: "LimitsTable",
	Suffix:    "limits",
	TTL:       true,
}

// All lists every table, in the order the stack creates them.
var All = []Table{State, Audit, Keys, Limits}

// Name returns the physical table name for an environment.
func (t Table) Name(env string) string { return stackname.Resource(env, t.Suffix) }
