package quota

import (
	"encoding/json"
	"strings"
)

// price lists what a DynamoDB request costs: against the partition of each key it writes or
// reads, in the base table and in each index whose key it writes, and against each table's
// and index's warm throughput. It reports whether a table it touches is provisioned.
func (m *Model) price(op string, req *ddbRequest) (charges []charge, provisioned bool) {
	add := func(action int, table string, r *ddbRequest, write bool, mult float64) {
		t, ok := m.tables[table]
		if !ok {
			return
		}
		provisioned = provisioned || t.Provisioned
		var key map[string]any
		switch {
		case r.Item != nil:
			key = r.Item
		default:
			key = r.Key
		}
		if !write {
			units := mult * 0.5
			if r.ConsistentRead || mult > 1 {
				units = mult
			}
			partitionKey, index := t.PartitionKey, ""
			pk := keyValue(key[t.PartitionKey])
			if r.IndexName != "" {
				for _, ix := range t.Indexes {
					if ix.Name == r.IndexName {
						partitionKey, index = ix.PartitionKey, ix.Name
					}
				}
			}
			if r.KeyConditionExpression != "" {
				pk = queryPartition(r.KeyConditionExpression, partitionKey, r.ExpressionAttributeNames, r.ExpressionAttributeValues)
			}
			charges = append(charges, m.readCharges(action, table, index, pk, units)...)
			return
		}
		size := itemSize(key)
		if r.Item == nil {
			// An update's or delete's new item is not in the request: the key and the
			// values it sets are what it is priced by.
			for _, v := range r.ExpressionAttributeValues {
				size += valueSize(v)
			}
		}
		units := writeUnits(size) * mult
		charges = append(charges, m.writeCharges(action, table, "", keyValue(key[t.PartitionKey]), units)...)
		// An index entry is written in the index's partition of the item's index key: the
		// item's attribute on a put, the value a SET assigns on an update.
		indexKeys := r.Item
		if r.UpdateExpression != "" {
			indexKeys = setValues(r.UpdateExpression, r.ExpressionAttributeNames, r.ExpressionAttributeValues)
		}
		for _, ix := range t.Indexes {
			v := keyValue(indexKeys[ix.PartitionKey])
			if v == "" {
				continue
			}
			u := units
			if ix.KeysOnly {
				u = mult
			}
			charges = append(charges, m.writeCharges(action, table, ix.Name, v, u)...)
		}
	}
	switch op {
	case "PutItem", "UpdateItem", "DeleteItem":
		add(0, req.TableName, req, true, 1)
	case "GetItem", "Query":
		add(0, req.TableName, req, false, 1)
	case "Scan":
		// A scan reads every partition: priced against the table's warm throughput only.
		if _, ok := m.tables[req.TableName]; ok {
			charges = append(charges, charge{DynamoWarmRead, 0, m.bucket(DynamoWarmRead, req.TableName), 1})
		}
	case "TransactWriteItems":
		// Transactional writes cost twice a plain write; a ConditionCheck is priced as a
		// write of its key.
		for i, item := range req.TransactItems {
			for _, kind := range []string{"Put", "Update", "Delete", "ConditionCheck"} {
				if a, ok := item[kind]; ok {
					add(i, a.TableName, &a, true, 2)
				}
			}
		}
	case "TransactGetItems":
		for i, item := range req.TransactItems {
			if a, ok := item["Get"]; ok {
				add(i, a.TableName, &a, false, 2)
			}
		}
	case "BatchWriteItem":
		for table, raw := range req.RequestItems {
			var writes []struct {
				PutRequest    *struct{ Item map[string]any }
				DeleteRequest *struct{ Key map[string]any }
			}
			_ = json.Unmarshal(raw, &writes)
			for _, w := range writes {
				switch {
				case w.PutRequest != nil:
					add(0, table, &ddbRequest{Item: w.PutRequest.Item}, true, 1)
				case w.DeleteRequest != nil:
					add(0, table, &ddbRequest{Key: w.DeleteRequest.Key}, true, 1)
				}
			}
		}
	case "BatchGetItem":
		for table, raw := range req.RequestItems {
			var get struct {
				Keys           []map[string]any
				ConsistentRead bool
			}
			_ = json.Unmarshal(raw, &get)
			for _, k := range get.Keys {
				add(0, table, &ddbRequest{Key: k, ConsistentRead: get.ConsistentRead}, false, 1)
			}
		}
	}
	return charges, provisioned
}

// writeCharges are a write's charges in one table or index: its partition and its warm
// throughput.
func (m *Model) writeCharges(action int, table, index, pk string, units float64) []charge {
	return m.tableCharges(DynamoWarmWrite, DynamoPartitionWrite, action, table, index, pk, units)
}

// readCharges are a read's, likewise.
func (m *Model) readCharges(action int, table, index, pk string, units float64) []charge {
	return m.tableCharges(DynamoWarmRead, DynamoPartitionRead, action, table, index, pk, units)
}

// tableCharges charges units to the table's (or index's) warm bucket and, when the key is
// known, to its partition's bucket.
func (m *Model) tableCharges(warm, partition ID, action int, table, index, pk string, units float64) []charge {
	name := table + "/" + index
	out := []charge{{warm, action, m.bucket(warm, name), units}}
	if pk != "" {
		row := m.rows[partition]
		b := m.bucketScaled(partition, name+"/"+pk, row.Bucket, row.Refill, SharedPartition(pk))
		out = append(out, charge{partition, action, b, units})
	}
	return out
}

// nodeKeyPrefix begins every key that belongs to one node (shared/table: the state table's
// items, a node's audit records, a reservation's list entries), as a "S:" key value.
const nodeKeyPrefix = "S:NODE#"

// SharedPartition reports whether a partition key (a key value, "S:...") is one the burst's
// reclaims share, so that the scale factor divides its quota. A burst of N·s reclaims over N·s
// nodes on AWS puts on each node's own partitions what a burst of N over N puts on them here:
// those keep AWS's whole throughput. Every other key (the byState shards OPSTATE#..., the node
// directory, an org's list, an API key's limiter item and its key items) takes s times the
// load on AWS, so its quota is divided by s.
func SharedPartition(pk string) bool { return !strings.HasPrefix(pk, nodeKeyPrefix) }
