package config

import (
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/config/envvar"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/eventbus"
	"github.com/openrelay/capacity/shared/stepfn"
)

// Store is the state store's configuration (shared/dynamo): its tables and how long it keeps
// history. A function has the state table and those of the others that envvar declares for
// it, so its declaration is the one list of the tables it uses.
type Store struct {
	StateTable, AuditTable, KeysTable, LimitsTable string
	HistoryRetention                               time.Duration // 0: the store's default
}

// ReadStore reads the store's variables the function declares (STATE_TABLE always); errors
// go to e.
func ReadStore(e *envvar.Env) Store {
	declared := func(v envvar.Text) string {
		if !e.Declares(v) {
			return ""
		}
		return v.Get(e)
	}
	s := Store{StateTable: envvar.StateTable.Get(e), AuditTable: declared(envvar.AuditTable),
		KeysTable: declared(envvar.KeysTable), LimitsTable: declared(envvar.LimitsTable)}
	if e.Declares(envvar.HistoryRetention) {
		s.HistoryRetention = envvar.HistoryRetention.Get(e)
	}
	return s
}

// Open returns the state store on cfg's DynamoDB.
func (s Store) Open(cfg aws.Config) *dynamo.Store {
	store := dynamo.New(dynamodb.NewFromConfig(cfg), s.StateTable, s.AuditTable)
	store.Retention, store.KeysTable, store.LimitsTable = s.HistoryRetention, s.KeysTable, s.LimitsTable
	return store
}

// Workflow returns the starter of the termination workflow, the state machine arn.
func Workflow(cfg aws.Config, arn string) *stepfn.Starter {
	return &stepfn.Starter{Client: sfn.NewFromConfig(cfg), StateMachineARN: arn}
}

// Bus returns the publisher on the event bus named bus; nil (no publisher) for "".
func Bus(cfg aws.Config, bus string) capacity.Publisher {
	if bus == "" {
		return nil
	}
	return eventbus.New(eventbridge.NewFromConfig(cfg), bus)
}

// Metrics returns the function's metrics recorder: EMF lines on stdout, under the
// environment's name.
func (c Common) Metrics() *emf.Recorder { return emf.New(os.Stdout, c.AppEnv) }
