package iamcheck

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/openrelay/capacity/shared/calllog"
	"github.com/openrelay/capacity/shared/table"
)

// Account is where the calls go: ARNs are built in it.
type Account struct {
	Partition, Region, ID string
}

// TableKeys is a table's partition key attribute and each global secondary index's: what
// dynamodb:LeadingKeys reads.
type TableKeys struct {
	Partition string
	Indexes   map[string]string
}

// Requests turns one recorded call into the authorisations IAM makes for it (a transaction
// is authorised per item action; CreateSchedule also passes its target's role). A call the
// mapping does not know is an error: the check cannot vouch for it.
func Requests(c calllog.Call, acct Account, tables map[string]TableKeys) ([]Request, error) {
	m := mapper{acct: acct, tables: tables, f: c.Fields}
	switch c.Service {
	case "DynamoDB":
		return m.dynamodb(c.Operation)
	case "SFN":
		switch c.Operation {
		case "StartExecution", "StartSyncExecution":
			return m.one("states:"+c.Operation, m.f["StateMachineArn"])
		case "DescribeExecution", "StopExecution", "GetExecutionHistory":
			return m.one("states:"+c.Operation, m.f["ExecutionArn"])
		}
	case "EventBridge":
		if c.Operation == "PutEvents" {
			return m.putEvents()
		}
	case "KMS":
		switch c.Operation {
		case "Encrypt", "Decrypt", "GenerateDataKey", "ReEncrypt", "DescribeKey":
			return m.kms(c.Operation)
		}
	case "Secrets Manager":
		if c.Operation == "GetSecretValue" || c.Operation == "DescribeSecret" {
			return m.one("secretsmanager:"+c.Operation, m.f["SecretId"])
		}
	case "Scheduler":
		switch c.Operation {
		case "CreateSchedule", "GetSchedule", "DeleteSchedule", "UpdateSchedule":
			return m.schedule(c.Operation)
		}
	case "SQS":
		switch c.Operation {
		case "ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility", "GetQueueAttributes", "SendMessage":
			return m.queue(c.Operation)
		case "DeleteMessageBatch", "ChangeMessageVisibilityBatch", "SendMessageBatch":
			return m.queue(strings.TrimSuffix(c.Operation, "Batch"))
		}
	case "Lambda":
		if c.Operation == "Invoke" {
			return m.one("lambda:InvokeFunction", m.arn("lambda", "function:"+m.f["FunctionName"], m.f["FunctionName"]))
		}
	}
	return nil, fmt.Errorf("no IAM mapping for %s %s: add one to iamcheck.Requests", c.Service, c.Operation)
}

type mapper struct {
	acct   Account
	tables map[string]TableKeys
	f      map[string]string
}

func (m mapper) one(action, resource string) ([]Request, error) {
	if resource == "" {
		return nil, fmt.Errorf("%s: the call names no resource", action)
	}
	return []Request{{Action: action, Resource: resource}}, nil
}

// arn returns id if it is already an ARN, else the ARN of resource in the account.
func (m mapper) arn(service, resource, id string) string {
	if strings.HasPrefix(id, "arn:") {
		return id
	}
	return fmt.Sprintf("arn:%s:%s:%s:%s:%s", m.acct.Partition, service, m.acct.Region, m.acct.ID, resource)
}

// dynamoItemActions are the item actions of a transaction, by the field that holds them.
var dynamoItemActions = map[string]string{
	"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem", "Get": "GetItem",
}

func (m mapper) dynamodb(op string) ([]Request, error) {
	switch op {
	case "GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "DescribeTable":
		r, err := m.tableRequest(op, "")
		if err != nil {
			return nil, err
		}
		return []Request{r}, nil
	case "TransactWriteItems", "TransactGetItems":
		var out []Request
		for i := 0; ; i++ {
			prefix := "TransactItems." + strconv.Itoa(i) + "."
			found := false
			for field, action := range dynamoItemActions {
				if _, ok := m.f[prefix+field+".TableName"]; !ok {
					continue
				}
				r, err := m.tableRequest(action, prefix+field+".")
				if err != nil {
					return nil, err
				}
				out, found = append(out, r), true
			}
			if !found {
				break
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("dynamodb:%s: the call names no table", op)
		}
		return out, nil
	case "BatchGetItem":
		return m.batchGet()
	}
	return nil, fmt.Errorf("no IAM mapping for DynamoDB %s: add one to iamcheck.Requests", op)
}

// batchGet is a BatchGetItem: dynamodb:BatchGetItem on each table it reads, with the
// partition keys of its keys there as dynamodb:LeadingKeys.
func (m mapper) batchGet() ([]Request, error) {
	leading := map[string][]string{}
	for k, v := range m.f {
		rest, ok := strings.CutPrefix(k, "RequestItems.")
		if !ok {
			continue
		}
		tableName, key, ok := strings.Cut(rest, ".Keys.")
		if !ok || !strings.HasSuffix(key, "."+table.PartitionKey) {
			continue
		}
		leading[tableName] = append(leading[tableName], v)
	}
	if len(leading) == 0 {
		return nil, fmt.Errorf("dynamodb:BatchGetItem: the call log holds no table or no key")
	}
	var out []Request
	for _, tableName := range slices.Sorted(maps.Keys(leading)) {
		vals := leading[tableName]
		sort.Strings(vals)
		out = append(out, Request{Action: "dynamodb:BatchGetItem", Resource: m.arn("dynamodb", "table/"+tableName, tableName),
			Known: []string{"dynamodb:LeadingKeys"}, Context: map[string][]string{"dynamodb:LeadingKeys": slices.Compact(vals)}})
	}
	return out, nil
}

// tableRequest is one DynamoDB action on the table (or index) the fields under prefix name,
// with dynamodb:LeadingKeys from the item's key, or from a Query's key condition.
func (m mapper) tableRequest(action, prefix string) (Request, error) {
	tableName := m.f[prefix+"TableName"]
	if tableName == "" {
		return Request{}, fmt.Errorf("dynamodb:%s: the call names no table", action)
	}
	resource := m.arn("dynamodb", "table/"+tableName, tableName)
	keys := m.tables[tableName[strings.LastIndex(tableName, "/")+1:]]
	partition := keys.Partition
	if index := m.f[prefix+"IndexName"]; index != "" {
		resource += "/index/" + index
		partition = keys.Indexes[index]
	}
	r := Request{Action: "dynamodb:" + action, Resource: resource, Known: []string{"dynamodb:LeadingKeys"}}
	var leading []string
	// The log records the item's table.PartitionKey only (every table's partition key).
	if v, ok := m.f[prefix+"Key."+table.PartitionKey]; ok && partition == table.PartitionKey {
		leading = append(leading, v)
	}
	if v, ok := m.f[prefix+"Item."+table.PartitionKey]; ok && partition == table.PartitionKey {
		leading = append(leading, v)
	}
	if kce := m.f[prefix+"KeyConditionExpression"]; kce != "" {
		v, err := m.keyConditionPartition(prefix, kce, partition)
		if err != nil {
			return Request{}, fmt.Errorf("dynamodb:%s on %s: %w", action, resource, err)
		}
		leading = append(leading, v)
	}
	if partition != "" && action != "Scan" && action != "DescribeTable" && len(leading) == 0 {
		// Without it a ForAllValues condition would hold vacuously: refuse to guess.
		return Request{}, fmt.Errorf("dynamodb:%s on %s: the call log holds no value of its partition key %q", action, resource, partition)
	}
	if len(leading) > 0 {
		r.Context = map[string][]string{"dynamodb:LeadingKeys": leading}
	}
	return r, nil
}

// equality is one "<name> = :value" clause of a key condition.
var equality = regexp.MustCompile(`([#\w]+)\s*=\s*(:\w+)`)

// keyConditionPartition finds the value the key condition sets the partition key to.
func (m mapper) keyConditionPartition(prefix, kce, partition string) (string, error) {
	for _, eq := range equality.FindAllStringSubmatch(kce, -1) {
		name := eq[1]
		if strings.HasPrefix(name, "#") {
			name = m.f[prefix+"ExpressionAttributeNames."+name]
		}
		if name != partition {
			continue
		}
		v, ok := m.f[prefix+"ExpressionAttributeValues."+eq[2]]
		if !ok {
			return "", fmt.Errorf("key condition %q: no value for %s in the call log", kce, eq[2])
		}
		return v, nil
	}
	return "", fmt.Errorf("key condition %q sets no partition key %q", kce, partition)
}

// putEvents authorises each entry: events:PutEvents on its bus, with its events:source and
// events:detail-type.
func (m mapper) putEvents() ([]Request, error) {
	var out []Request
	for i := 0; ; i++ {
		prefix := "Entries." + strconv.Itoa(i) + "."
		bus, hasBus := m.f[prefix+"EventBusName"]
		source, hasSource := m.f[prefix+"Source"]
		if !hasBus && !hasSource {
			break
		}
		if bus == "" {
			bus = "default"
		}
		ctx := map[string][]string{"events:source": {source}}
		if dt, ok := m.f[prefix+"DetailType"]; ok {
			ctx["events:detail-type"] = []string{dt}
		}
		out = append(out, Request{Action: "events:PutEvents", Resource: m.arn("events", "event-bus/"+bus, bus),
			Context: ctx, Known: []string{"events:source", "events:detail-type"}})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("events:PutEvents: the call holds no entries")
	}
	return out, nil
}

func (m mapper) kms(op string) ([]Request, error) {
	id := m.f["KeyId"]
	if id == "" || strings.HasPrefix(id, "alias/") || strings.Contains(id, ":alias/") {
		return nil, fmt.Errorf("kms:%s by %q: only calls that name the key by id or ARN are modelled", op, id)
	}
	ctx := map[string][]string{}
	var keys []string
	for f, v := range m.f {
		if k, ok := strings.CutPrefix(f, "EncryptionContext."); ok {
			ctx["kms:EncryptionContext:"+k] = []string{v}
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		sort.Strings(keys)
		ctx["kms:EncryptionContextKeys"] = keys
	}
	return []Request{{Action: "kms:" + op, Resource: m.arn("kms", "key/"+id, id), Context: ctx,
		Known: []string{"kms:EncryptionContext:", "kms:EncryptionContextKeys"}}}, nil
}

// schedule authorises a schedule action on arn:...:schedule/<group>/<name>; creating or
// updating one also passes its target's role to EventBridge Scheduler (iam:PassRole).
func (m mapper) schedule(op string) ([]Request, error) {
	name, group := m.f["Name"], m.f["GroupName"]
	if name == "" {
		return nil, fmt.Errorf("scheduler:%s: the call names no schedule", op)
	}
	if group == "" {
		group = "default"
	}
	out := []Request{{Action: "scheduler:" + op, Resource: m.arn("scheduler", "schedule/"+group+"/"+name, "")}}
	if role := m.f["Target.RoleArn"]; role != "" && (op == "CreateSchedule" || op == "UpdateSchedule") {
		out = append(out, Request{Action: "iam:PassRole", Resource: role,
			Context: map[string][]string{"iam:PassedToService": {"scheduler.amazonaws.com"}}, Known: []string{"iam:PassedToService"}})
	}
	return out, nil
}

// queue authorises an SQS action on the queue its URL (http(s)://host/<account>/<name>) names.
func (m mapper) queue(action string) ([]Request, error) {
	u, err := url.Parse(m.f["QueueUrl"])
	if err != nil || u.Path == "" {
		return nil, fmt.Errorf("sqs:%s: queue URL %q", action, m.f["QueueUrl"])
	}
	parts := slices.DeleteFunc(strings.Split(u.Path, "/"), func(s string) bool { return s == "" })
	if len(parts) != 2 {
		return nil, fmt.Errorf("sqs:%s: queue URL %q is not <host>/<account>/<name>", action, u)
	}
	return []Request{{Action: "sqs:" + action,
		Resource: fmt.Sprintf("arn:%s:sqs:%s:%s:%s", m.acct.Partition, m.acct.Region, parts[0], parts[1])}}, nil
}
