package e2e

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/auth"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/httpapi"
	"github.com/openrelay/capacity/shared/routes"
)

// The authorisation matrix: every route of the route table (shared/routes) x every kind of
// caller x every state of the reservation the route concerns, each cell with the status the
// rules give it (docs/api.md: "Order of checks", "Permissions", "Operator routes";
// docs/security.md: "Principals"). TestAuthMatrix sends every cell through API Gateway (or, for an event source, puts
// the event on the bus) and checks the status, and that every refused call and every read
// changed nothing. docs/security.md shows this table as it is here (TestAuthMatrixDoc; write it
// with `go test ./localstack/e2e -run TestAuthMatrixDoc -update-doc`).

var updateDoc = flag.Bool("update-doc", false, "write authMatrix into docs/security.md (with -run TestAuthMatrixDoc; starts no local stack)")

// authMatrix is the one table of expected statuses. A row is a route (its operationId in
// shared/routes) and, for a route under a reservation, the reservation's state; a column is a
// caller (matrixCallers says who each is). "·": the caller has no way to make that call (an
// event source where the route has no event equivalent); "dropped": no rule routes the event
// from that source, so it reaches nothing, is answered nowhere and changes nothing.
const authMatrix = `
| route | state | op:capacity | op:read | op:place | op:node | op:resv | op:keys | op:audit | owner | owner:read | owner:cap | manager | audience | stranger | no-perm | revoked | expired | no key | malformed | ev:scheduler | ev:fleet | ev:schedule |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| getOpenAPI | - | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | · | · | · |
| getReservation | active | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReservation | pending | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReservation | expired | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReservation | cancelled | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReservation | needs-review | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReservation | outside-term | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reclaim | active | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | 200 | dropped | 409 |
| reclaim | pending | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | 409 | dropped | 409 |
| reclaim | expired | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | 409 | dropped | 409 |
| reclaim | cancelled | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | 409 | dropped | 409 |
| reclaim | needs-review | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | 409 | dropped | 409 |
| reclaim | outside-term | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | 409 | dropped | 409 |
| planReclaim | active | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| planReclaim | pending | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| planReclaim | expired | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| planReclaim | cancelled | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| planReclaim | needs-review | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| planReclaim | outside-term | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| release | active | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| release | pending | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| release | expired | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| release | cancelled | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| release | needs-review | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| release | outside-term | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 409 | 404 | 409 | 409 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReclaimOperation | active | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReclaimOperation | pending | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReclaimOperation | expired | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReclaimOperation | cancelled | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReclaimOperation | needs-review | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getReclaimOperation | outside-term | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| retryReclaimOperation | active | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| retryReclaimOperation | pending | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| retryReclaimOperation | expired | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| retryReclaimOperation | cancelled | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| retryReclaimOperation | needs-review | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| retryReclaimOperation | outside-term | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listScheduledReclaims | active | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listScheduledReclaims | pending | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listScheduledReclaims | expired | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listScheduledReclaims | cancelled | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listScheduledReclaims | needs-review | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listScheduledReclaims | outside-term | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getScheduledReclaim | active | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getScheduledReclaim | pending | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getScheduledReclaim | expired | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getScheduledReclaim | cancelled | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getScheduledReclaim | needs-review | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getScheduledReclaim | outside-term | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelScheduledReclaim | active | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelScheduledReclaim | pending | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelScheduledReclaim | expired | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelScheduledReclaim | cancelled | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelScheduledReclaim | needs-review | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelScheduledReclaim | outside-term | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 200 | 200 | 403 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| placeVM | - | 404 | 404 | 201 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getNode | - | 404 | 200 | 404 | 200 | 404 | 404 | 404 | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservations | - | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 404 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservationAudit | active | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservationAudit | pending | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservationAudit | expired | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservationAudit | cancelled | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservationAudit | needs-review | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReservationAudit | outside-term | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listNodes | - | 200 | 200 | 404 | 200 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getNodeUnits | - | 200 | 200 | 404 | 200 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReclaimOperations | active | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReclaimOperations | pending | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReclaimOperations | expired | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReclaimOperations | cancelled | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReclaimOperations | needs-review | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listReclaimOperations | outside-term | 200 | 200 | 404 | 404 | 404 | 404 | 404 | 200 | 200 | 200 | 200 | 200 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| putNode | - | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| setTopology | - | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | dropped | 200 | dropped |
| rotateAgentKey | - | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| endAgentKeyOverlap | - | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listNodeAudit | - | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| createReservation | - | 404 | 404 | 404 | 404 | 201 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelReservation | active | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelReservation | pending | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelReservation | expired | 404 | 404 | 404 | 404 | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelReservation | cancelled | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelReservation | needs-review | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| cancelReservation | outside-term | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reaffirmReservation | active | 404 | 404 | 404 | 404 | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reaffirmReservation | pending | 404 | 404 | 404 | 404 | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reaffirmReservation | expired | 404 | 404 | 404 | 404 | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reaffirmReservation | cancelled | 404 | 404 | 404 | 404 | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reaffirmReservation | needs-review | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| reaffirmReservation | outside-term | 404 | 404 | 404 | 404 | 409 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| forceEndVM | active | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| forceEndVM | pending | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| forceEndVM | expired | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| forceEndVM | cancelled | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| forceEndVM | needs-review | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| forceEndVM | outside-term | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| createKey | - | 404 | 404 | 404 | 404 | 404 | 201 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listKeys | - | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getKey | - | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| revokeKey | - | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| listKeyAudit | - | 404 | 404 | 404 | 404 | 404 | 404 | 200 | 404 | 404 | 404 | 404 | 404 | 404 | 404 | 401 | 401 | 401 | 401 | · | · | · |
| getSelfKey | - | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 200 | 401 | 401 | 401 | 401 | · | · | · |
`

// The reservation states of the rows of routes under a reservation ("-" for the others).
var matrixStates = []string{"active", "pending", "expired", "cancelled", "needs-review", "outside-term"}

// matrixCaller is a column of the matrix.
type matrixCaller struct {
	name   string
	key    *capacity.APIKey // seeded for the run; nil: the bearer below as it is
	bearer string           // "" sends no Authorization header
	source string           // an inbound event source instead of an API key
}

const orgStranger = "org-stranger" // holds every tenant permission, has no role on the demo node

// matrixCallers returns the columns, in the table's order, with their keys seeded in the keys
// table (fresh ones each run, so no function instance has cached them).
func matrixCallers(t *testing.T) []matrixCaller {
	t.Helper()
	run := time.Now().UnixNano()
	past := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	var seed []capacity.APIKey
	key := func(name, org string, operator bool, perms ...string) matrixCaller {
		k := capacity.APIKey{KeyID: fmt.Sprintf("key-matrix-%d-%d", run, len(seed)), OrgID: org, Operator: operator, Permissions: perms,
			Description: "authorisation matrix: " + name}
		c := matrixCaller{name: name, bearer: auth.NewSecret()}
		k.Hash = auth.Hash(c.bearer)
		seed = append(seed, k)
		c.key = &seed[len(seed)-1]
		return c
	}
	op := func(name, perm string) matrixCaller { return key(name, demo.OrgPlatform, true, perm) }
	tenant := []string{capacity.PermCapacity, capacity.PermRead}
	seed = make([]capacity.APIKey, 0, 32) // c.key points into it: no reallocation
	callers := []matrixCaller{
		op("op:capacity", capacity.PermCapacity),
		op("op:read", capacity.PermRead),
		op("op:place", capacity.PermPlace),
		op("op:node", capacity.PermNodeManage),
		op("op:resv", capacity.PermReservationManage),
		op("op:keys", capacity.PermKeyManage),
		op("op:audit", capacity.PermAuditRead),
		key("owner", demo.OrgOwner, false, tenant...),
		key("owner:read", demo.OrgOwner, false, capacity.PermRead),
		key("owner:cap", demo.OrgOwner, false, capacity.PermCapacity),
		key("manager", demo.OrgManager, false, tenant...),
		key("audience", demo.OrgAudience, false, tenant...),
		key("stranger", orgStranger, false, tenant...),
		// The node owner's org with a permission no tenant route takes (placement is for
		// operator keys only).
		key("no-perm", demo.OrgOwner, false, capacity.PermPlace),
		key("revoked", demo.OrgOwner, false, tenant...),
		key("expired", demo.OrgOwner, false, tenant...),
		{name: "no key"},
		// A well-formed secret with one character changed: its checksum no longer matches.
		{name: "malformed", bearer: malformed(auth.NewSecret())},
		{name: "ev:scheduler", source: capacity.SourcePlatformScheduler},
		{name: "ev:fleet", source: capacity.SourceFleet},
		{name: "ev:schedule", source: capacity.SourceSchedule},
	}
	for _, c := range callers {
		switch c.name {
		case "revoked":
			c.key.Revoked, c.key.RevokedAt = true, &past
		case "expired":
			c.key.ExpiresAt = &past
		}
	}
	if err := store.Keys().Put(context.Background(), seed...); err != nil {
		t.Fatalf("seed the matrix's keys: %v", err)
	}
	return callers
}

func malformed(secret string) string {
	b := []byte(secret)
	if b[10] == 'A' {
		b[10] = 'B'
	} else {
		b[10] = 'A'
	}
	return string(b)
}

// matrixRow is a row of authMatrix.
type matrixRow struct {
	op, state string
	want      []string // by column
}

// parseAuthMatrix reads authMatrix and checks its shape against the route table: every route
// has its rows (one per state under a reservation, else one), and nothing else has any.
func parseAuthMatrix(t *testing.T) (columns []string, rows []matrixRow) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(authMatrix), "\n")
	cells := func(line string) []string {
		f := strings.Split(strings.Trim(line, "| "), " | ")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		return f
	}
	head := cells(lines[0])
	if len(head) < 3 || head[0] != "route" || head[1] != "state" {
		t.Fatalf("authMatrix header: %q", lines[0])
	}
	columns = head[2:]
	seen := map[string]bool{}
	for _, line := range lines[2:] {
		f := cells(line)
		if len(f) != len(head) {
			t.Fatalf("authMatrix row %q: %d cells, want %d", line, len(f), len(head))
		}
		for _, w := range f[2:] {
			if _, err := strconv.Atoi(w); err != nil && w != "·" && w != "dropped" {
				t.Fatalf("authMatrix row %q: cell %q", line, w)
			}
		}
		rows = append(rows, matrixRow{op: strings.Trim(f[0], "`"), state: f[1], want: f[2:]})
		seen[strings.Trim(f[0], "`")+" "+f[1]] = true
	}
	want := 0
	for _, r := range routes.All {
		states := []string{"-"}
		if underReservation(r) {
			states = matrixStates
		}
		for _, s := range states {
			want++
			if !seen[r.OperationID+" "+s] {
				t.Errorf("authMatrix has no row for %s (%s %s) in state %s", r.OperationID, r.Method, r.Path, s)
			}
		}
	}
	if len(rows) != want {
		t.Errorf("authMatrix has %d rows; the route table makes %d", len(rows), want)
	}
	return columns, rows
}

func underReservation(r routes.Route) bool { return strings.Contains(r.Path, "/reservations/{id}") }

// TestAuthMatrixDoc: the copy of the matrix in docs/security.md is authMatrix, character for character.
func TestAuthMatrixDoc(t *testing.T) {
	parseAuthMatrix(t)
	const begin, end = "<!-- authmatrix:begin (go test ./localstack/e2e -run TestAuthMatrixDoc -update-doc) -->\n", "<!-- authmatrix:end -->"
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("docs/security.md has no %q ... %q", strings.TrimSpace(begin), end)
	}
	table := strings.TrimSpace(authMatrix) + "\n"
	if string(doc[i+len(begin):j]) == table {
		return
	}
	if !*updateDoc {
		t.Fatalf("the authorisation matrix of docs/security.md differs from authMatrix: run go test ./localstack/e2e -run TestAuthMatrixDoc -update-doc")
	}
	out := slices.Concat(doc[:i+len(begin)], []byte(table), doc[j:])
	if err := os.WriteFile("../../docs/security.md", out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// matrixFixture is a node whose demo reservation is in one state, with something under it
// for every route: a reclaim operation (reclaimId, ended), a scheduled reclaim (pending unless
// the reservation was cancelled), and a key that op:keys may revoke.
type matrixFixture struct {
	node, reclaimID, scheduledID string
	units                        []string // the node's unit list
	target                       capacity.APIKey
	watch                        *busWatch // outcomes of the events about the node
	seq                          int
}

// newMatrixFixture seeds a demo node, reclaims gpu-2 (evicting vm-spot-1: the operation),
// schedules a reclaim of gpu-3 two hours ahead, waits for the operation to end, then moves
// the reservation into the state: cancelled and needs-review through the API, pending,
// expired (endsAt passed) and outside-term (startsAt ahead) written to the table.
func newMatrixFixture(t *testing.T, state string, events bool) *matrixFixture {
	t.Helper()
	f := &matrixFixture{node: newNode(t, nil), units: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}}
	if events {
		f.watch = watchBus(t, map[string]any{
			"source": []string{capacity.SourceCapacity},
			"detail-type": []string{capacity.DetailReclaimCompleted, capacity.DetailReclaimRefused,
				capacity.DetailTopologyApplied, capacity.DetailTopologyRefused},
			"detail": map[string]any{"nodeId": []string{f.node}},
		})
	}
	r := call(t, http.MethodPost, reclaimPath(f.node), keyOperator, map[string]any{"unitIds": []string{"gpu-2"}, "reason": "matrix fixture"})
	f.reclaimID, _ = r.json(t)["reclaimId"].(string)
	if r.Status != http.StatusOK || f.reclaimID == "" {
		t.Fatalf("fixture reclaim: %d %s", r.Status, r.Body)
	}
	at := time.Now().UTC().Add(2 * time.Hour).Truncate(time.Second)
	s := call(t, http.MethodPost, reclaimPath(f.node), keyOperator, map[string]any{"unitIds": []string{"gpu-3"}, "at": at.Format(time.RFC3339)})
	f.scheduledID, _ = s.json(t)["id"].(string)
	if s.Status != http.StatusAccepted || f.scheduledID == "" {
		t.Fatalf("fixture schedule: %d %s", s.Status, s.Body)
	}
	if op := awaitOperation(t, f.node, f.reclaimID, 60*time.Second); op["state"] != "completed" {
		t.Fatalf("fixture operation: %v", op)
	}
	resv := "/v1/nodes/" + f.node + "/reservations/" + demo.ReservationID
	now := time.Now().UTC()
	switch state {
	case "active", "-":
	case "pending":
		f.setReservation(t, "Status", string(capacity.StatusPending))
	case "expired":
		f.setReservation(t, "EndsAt", now.Add(-time.Minute))
	case "outside-term":
		f.setReservation(t, "StartsAt", now.Add(time.Hour))
	case "cancelled":
		if c := call(t, http.MethodPost, resv+"/cancel", keyOperator, map[string]any{"reason": "matrix fixture"}); c.Status != http.StatusOK {
			t.Fatalf("fixture cancel: %d %s", c.Status, c.Body)
		}
	case "needs-review":
		f.units = append(f.units, "gpu-8")
		if c := call(t, http.MethodPut, "/v1/nodes/"+f.node+"/topology", keyOperator, map[string]any{"unitIds": f.units, "reason": "matrix fixture"}); c.Status != http.StatusOK {
			t.Fatalf("fixture topology: %d %s", c.Status, c.Body)
		}
	default:
		t.Fatalf("no fixture for state %q", state)
	}
	// The reservation reads as the row's state says (outside its term it is still active).
	want := map[string]string{"-": "active", "outside-term": "active"}[state]
	if got := call(t, http.MethodGet, resv, keyOperator, nil).json(t)["status"]; got != cmp.Or(want, state) {
		t.Fatalf("fixture for state %s: the reservation reads %v", state, got)
	}
	f.newTarget(t)
	return f
}

// setReservation writes one attribute of the demo reservation straight to the table.
func (f *matrixFixture) setReservation(t *testing.T, attr string, v any) {
	t.Helper()
	av, err := attributevalue.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: aws.String(store.Table),
		Key: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "NODE#" + f.node}, "sk": &types.AttributeValueMemberS{Value: "RES#" + demo.ReservationID},
		},
		UpdateExpression:          aws.String("SET #a = :v"),
		ConditionExpression:       aws.String("attribute_exists(pk)"),
		ExpressionAttributeNames:  map[string]string{"#a": attr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":v": av},
	})
	if err != nil {
		t.Fatalf("set %s of %s's reservation: %v", attr, f.node, err)
	}
}

// newTarget seeds a fresh key that op:keys may revoke (it holds key.manage only) as the
// target of the key routes.
func (f *matrixFixture) newTarget(t *testing.T) {
	t.Helper()
	f.target = capacity.APIKey{KeyID: fmt.Sprintf("key-matrix-target-%d", time.Now().UnixNano()), OrgID: demo.OrgPlatform, Operator: true,
		Permissions: []string{capacity.PermKeyManage}, Hash: auth.Hash(auth.NewSecret()), Description: "authorisation matrix: a key to revoke"}
	if err := store.Keys().Put(context.Background(), f.target); err != nil {
		t.Fatalf("seed the matrix's target key: %v", err)
	}
}

// request is the call of a route on the fixture: its path with the fixture's ids and a body
// the route accepts (so that a caller who may make the call gets past its checks).
func (f *matrixFixture) request(op string) (method, path string, body any) {
	r, ok := routes.Find(op)
	if !ok {
		panic("no route " + op)
	}
	f.seq++
	path = strings.NewReplacer("{nodeId}", f.node, "{id}", demo.ReservationID, "{reclaimId}", f.reclaimID,
		"{scheduledReclaimId}", f.scheduledID, "{vmId}", "vm-spot-1", "{keyId}", f.target.KeyID).Replace(r.Path)
	const reason = "authorisation matrix"
	now := time.Now().UTC().Truncate(time.Second)
	switch op {
	case "reclaim":
		body = map[string]any{"unitIds": []string{"gpu-4"}, "reason": reason}
	case "release":
		body = map[string]any{"unitIds": []string{"gpu-1"}, "reason": reason}
	case "planReclaim":
		body = map[string]any{"count": 1, "reason": reason}
	case "placeVM":
		body = map[string]any{"vmId": fmt.Sprintf("vm-matrix-%d", f.seq), "orgId": demo.OrgBuyer, "tier": "spot", "unitIds": []string{"gpu-5"}}
	case "putNode":
		body = map[string]any{"ownerOrgId": demo.OrgOwner, "unitIds": f.units, "agentEndpoint": agents.Endpoint(f.node), "reason": reason}
	case "setTopology":
		body = map[string]any{"unitIds": f.units, "reason": reason}
	case "createReservation":
		// managingOrgIds left out: an org list left out is empty (the document once required it).
		body = map[string]any{"reservedUnitIds": []string{"gpu-6"}, "startsAt": now.Format(time.RFC3339),
			"endsAt": now.Add(24 * time.Hour).Format(time.RFC3339), "allowedOrgIds": []string{demo.OrgAudience}, "reason": reason}
	case "createKey":
		body = map[string]any{"orgId": demo.OrgPlatform, "operator": true, "permissions": []string{capacity.PermKeyManage}, "description": reason}
	case "rotateAgentKey", "endAgentKeyOverlap", "cancelReservation", "reaffirmReservation", "forceEndVM", "revokeKey":
		body = map[string]any{"reason": reason}
	}
	return r.Method, path, body
}

// event is the event equivalent of a route from a source (detail type and detail).
func (f *matrixFixture) event(op, source string) (string, map[string]any) {
	switch {
	case op == "setTopology":
		return capacity.DetailTopologyChanged, map[string]any{"nodeId": f.node, "unitIds": f.units, "reason": "authorisation matrix"}
	case source == capacity.SourceSchedule:
		// A firing of the fixture's scheduled reclaim, long before its time.
		return capacity.DetailReclaimRequested, map[string]any{"nodeId": f.node, "reservationId": demo.ReservationID, "scheduledReclaimId": f.scheduledID}
	}
	return capacity.DetailReclaimRequested, map[string]any{"nodeId": f.node, "reservationId": demo.ReservationID, "unitIds": []string{"gpu-4"},
		"actingOrgId": demo.OrgPlatform, "reason": "authorisation matrix"}
}

// snapshot is what a refused call must leave as it was. On a node: every item of its
// partition in the state table (the node item with the head of its changes chain, the
// reservation, VMs, operations, scheduled reclaims), except the head of its calls chain, to
// which a refusal appends its record by design (docs/api.md, Audit), unless calls is set (a
// 401 is refused before the caller is known and leaves no record at all). On the key routes:
// the head of the key-management chain and the target key (but its lastUsedAt).
func (f *matrixFixture) snapshot(t *testing.T, op string, calls bool) any {
	t.Helper()
	r, _ := routes.Find(op)
	switch {
	case op == "getOpenAPI":
		return nil
	case strings.HasPrefix(r.Path, "/v1/keys"):
		head := getItem(t, store.KeysTable, "APIKEYS", "AUDITHEAD")
		k := getItem(t, store.KeysTable, "APIKEY#"+f.target.Hash, "APIKEY")
		delete(k, "LastUsedAt")
		return []map[string]types.AttributeValue{head, k}
	}
	items := partition(t, f.node)
	if calls {
		return items
	}
	return slices.DeleteFunc(items, func(it map[string]types.AttributeValue) bool {
		sk, _ := it["sk"].(*types.AttributeValueMemberS)
		return sk != nil && sk.Value == "AUDITHEAD#CALLS"
	})
}

func getItem(t *testing.T, table, pk, sk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: sk}},
	})
	if err != nil {
		t.Fatalf("get %s %s/%s: %v", table, pk, sk, err)
	}
	return out.Item
}

// matrixJob is cells run one after another on one fixture.
type matrixJob struct {
	name, state string
	cells       []matrixCell
	events      bool
}

type matrixCell struct {
	row    matrixRow
	caller matrixCaller
	want   string
}

// Routes whose success moves the reservation out of its row's state: each such cell gets a
// fixture of its own.
var matrixStateMovers = []string{"cancelReservation", "reaffirmReservation"}

// matrixWorkers: fixtures run side by side (each job's cells run in order on its own node).
const matrixWorkers = 4

func TestAuthMatrix(t *testing.T) {
	if faultSpec != "" {
		t.Skip("exact statuses: not under injected faults")
	}
	columns, rows := parseAuthMatrix(t)
	callers := matrixCallers(t)
	for i, c := range callers {
		if i >= len(columns) || columns[i] != c.name {
			t.Fatalf("authMatrix's columns %v are not the callers %v", columns, callers)
		}
	}
	if len(callers) != len(columns) {
		t.Fatalf("authMatrix has %d caller columns, the test %d", len(columns), len(callers))
	}

	// One job per state (the routes under a reservation) and one for the other routes, on a
	// fixture whose reservation is active; a cell that moves the state gets its own.
	jobs := map[string]*matrixJob{}
	var order []*matrixJob
	job := func(name, state string) *matrixJob {
		if j := jobs[name]; j != nil {
			return j
		}
		j := &matrixJob{name: name, state: state}
		jobs[name] = j
		order = append(order, j)
		return j
	}
	for _, r := range rows {
		for i, c := range callers {
			cell := matrixCell{row: r, caller: c, want: r.want[i]}
			if cell.want == "·" {
				continue
			}
			name := "state=" + r.state
			if r.state == "-" {
				name = "node-routes"
			}
			if slices.Contains(matrixStateMovers, r.op) && strings.HasPrefix(cell.want, "2") {
				name = fmt.Sprintf("%s/%s/%s", r.op, r.state, c.name)
			}
			j := job(name, r.state)
			j.cells = append(j.cells, cell)
			j.events = j.events || c.source != ""
		}
	}

	var checked, events, unchanged atomic.Int64
	sem := make(chan struct{}, matrixWorkers)
	var wg sync.WaitGroup
	start := time.Now()
	for _, j := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(j.name, func(t *testing.T) {
				c, e, u := j.run(t)
				checked.Add(c)
				events.Add(e)
				unchanged.Add(u)
			})
		}()
	}
	wg.Wait()
	t.Logf("authorisation matrix: %d routes x %d callers x up to %d reservation states: %d cells checked (%d calls through API Gateway, %d events on the bus), %d refused calls and reads verified to change nothing, in %s",
		len(routes.All), len(callers), len(matrixStates), checked.Load(), checked.Load()-events.Load(), events.Load(), unchanged.Load(), time.Since(start).Round(time.Second))
}

// run checks the job's cells in order on a fixture of its own and returns how many it
// checked, how many of those were events, and how many it verified changed nothing.
func (j *matrixJob) run(t *testing.T) (checked, events, unchanged int64) {
	f := newMatrixFixture(t, j.state, j.events)
	// Events no rule routes are put first and looked for last: had one been routed, it would
	// have been answered (and audited) by then.
	type droppedEvent struct {
		cell matrixCell
		id   string
	}
	var dropped []droppedEvent
	for _, c := range j.cells {
		if c.want == "dropped" {
			dt, d := f.event(c.row.op, c.caller.source)
			dropped = append(dropped, droppedEvent{c, putEvent(t, c.caller.source, dt, d)})
		}
	}
	putAt := time.Now()
	for _, c := range j.cells {
		if c.want == "dropped" {
			continue
		}
		want, _ := strconv.Atoi(c.want)
		if c.row.op == "revokeKey" && want < 300 {
			f.newTarget(t) // the key it revokes
		}
		before := f.snapshot(t, c.row.op, want == http.StatusUnauthorized)
		var got int
		var body string
		method := "EVENT"
		if c.caller.source != "" {
			events++
			dt, d := f.event(c.row.op, c.caller.source)
			id := putEvent(t, c.caller.source, dt, d)
			ev := f.watch.await(c.caller.name+" "+c.row.op, 1, 60*time.Second, byRequest(id))[0]
			got, body = http.StatusOK, string(ev.Detail)
			if ev.DetailType == capacity.DetailReclaimRefused || ev.DetailType == capacity.DetailTopologyRefused {
				code, _ := ev.detail["code"].(string)
				got = httpapi.StatusOf(capacity.Code(code))
			}
		} else {
			var path string
			var reqBody any
			method, path, reqBody = f.request(c.row.op)
			r := call(t, method, path, c.caller.bearer, reqBody)
			got, body = r.Status, string(r.Body)
		}
		checked++
		if got != want {
			t.Errorf("%s in state %s by %s: %d, want %d (the rules of docs/api.md): %s", c.row.op, c.row.state, c.caller.name, got, want, body)
		}
		if got >= 400 || method == http.MethodGet {
			if after := f.snapshot(t, c.row.op, got == http.StatusUnauthorized); !reflect.DeepEqual(before, after) {
				t.Errorf("%s in state %s by %s answered %d and changed what it must not:\nbefore %v\nafter  %v", c.row.op, c.row.state, c.caller.name, got, before, after)
			} else {
				unchanged++
			}
		}
	}
	if len(dropped) > 0 {
		time.Sleep(time.Until(putAt.Add(3 * time.Second)))
		f.watch.receive()
		for _, d := range dropped {
			checked++
			events++
			answered := slices.ContainsFunc(f.watch.seen, byRequest(d.id))
			if recs := auditByEvent(t, f.node, d.id); answered || len(recs) > 0 {
				t.Errorf("%s from %s in state %s: routed (answered %v, %d audit records), want dropped", d.cell.row.op, d.cell.caller.source, d.cell.row.state, answered, len(recs))
			} else {
				unchanged++
			}
		}
	}
	return checked, events, unchanged
}
