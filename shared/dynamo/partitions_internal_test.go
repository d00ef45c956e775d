package dynamo

import (
	"regexp"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/table"
)

// iamLike matches s against an IAM StringLike pattern ('*' any run of characters, '?' one).
func iamLike(pattern, s string) bool {
	re := "^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$"
	return regexp.MustCompile(re).MatchString(s)
}

// The reconciler's IAM condition (table.OperationPartitions) admits the partition of every
// operation and its outcomes, and no partition of a node, its history or its idempotency
// records, whatever the ids.
func TestOperationPartitionsPattern(t *testing.T) {
	ids := []string{"n1", "a", "node-1.x_y", "OP", "HIST", "n-OP-1"}
	for _, node := range ids {
		for _, op := range []string{"rcl_1", "x", "OP"} {
			if pk := opPK(node, op); !iamLike(table.OperationPartitions, pk) {
				t.Errorf("operation partition %s not admitted", pk)
			}
		}
		for _, pk := range []string{nodePK(node), histPK(node), opStatePK("pending-start", "rcl_1"), legacyOpStatePK("pending-start")} {
			if iamLike(table.OperationPartitions, pk) {
				t.Errorf("partition %s admitted", pk)
			}
		}
	}
}
