package cost

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Design is what the cost of a reclaim depends on in a synthesised template, by physical
// name. It is JSON so that a design can be kept (docs/cost/before.json) and priced again
// beside a later one.
type Design struct {
	Env           string                  `json:"env"`
	APIs          []API                   `json:"apis"`
	Functions     map[string]Function     `json:"functions"`
	StateMachines map[string]StateMachine `json:"stateMachines"`
	Tables        map[string]Table        `json:"tables"` // by suffix: "state", "audit", ...
	Queues        map[string]Queue        `json:"queues,omitempty"`
}

// API is a REST API's stage and the function its methods proxy to.
type API struct {
	Kind           string `json:"kind"` // "REST"
	Function       string `json:"function"`
	Tracing        bool   `json:"tracing"`
	AccessLogBytes int    `json:"accessLogBytes"` // the access log format's length: about a line's
	AccessLogDays  int    `json:"accessLogDays"`
	ExecutionLogs  string `json:"executionLogs"` // the stage's logging level: OFF, ERROR or INFO
}

// Function is a Lambda function.
type Function struct {
	MemoryMB int    `json:"memoryMB"`
	Arch     string `json:"arch"`
	Tracing  bool   `json:"tracing"`
	LogDays  int    `json:"logDays"` // its log group's retention (0: for good)
	// NoPlatformLogs: its system log level (WARN or above) drops Lambda's own INFO lines
	// (START, END, REPORT).
	NoPlatformLogs bool `json:"noPlatformLogs,omitempty"`
	// StateMachines it may start: those its environment names.
	StateMachines []string `json:"stateMachines,omitempty"`
	// Queues it consumes (event source mappings).
	Queues []string `json:"queues,omitempty"`
}

// StateMachine is a Step Functions state machine.
type StateMachine struct {
	Type         string          `json:"type"` // STANDARD or EXPRESS
	Definition   json.RawMessage `json:"definition"`
	LogLevel     string          `json:"logLevel"` // OFF, ERROR, FATAL, ALL
	LogExecution bool            `json:"logExecutionData"`
	LogDays      int             `json:"logDays"`
	Tracing      bool            `json:"tracing"`
}

// Table is a DynamoDB table.
type Table struct {
	// Class is the table class: "" or STANDARD, or STANDARD_INFREQUENT_ACCESS (storage at
	// 40% of the price, requests at 125%).
	Class    string  `json:"class,omitempty"`
	OnDemand bool    `json:"onDemand"`
	PITR     bool    `json:"pitr"`
	Indexes  []Index `json:"indexes,omitempty"`
}

// Index is a global secondary index: which items it holds (those with its keys) and what of
// them (its projection).
type Index struct {
	Name       string   `json:"name"`
	Keys       []string `json:"keys"`
	Projection string   `json:"projection"` // ALL, KEYS_ONLY, INCLUDE
	Include    []string `json:"include,omitempty"`
}

// Queue is an SQS queue.
type Queue struct {
	FIFO bool `json:"fifo"`
}

type resource struct {
	Type       string         `json:"Type"`
	Properties map[string]any `json:"Properties"`
}

// Extract reads the design of env's stack from its template (JSON as CloudFormation takes
// it). Physical names are "capacity-<env>-<name>"; the design keys them by <name>.
func Extract(templateJSON []byte, env string) (Design, error) {
	var tp struct {
		Resources map[string]resource `json:"Resources"`
	}
	if err := json.Unmarshal(templateJSON, &tp); err != nil {
		return Design{}, err
	}
	prefix := "capacity-" + env + "-"
	short := func(physical any) string { s, _ := physical.(string); return strings.TrimPrefix(s, prefix) }
	d := Design{Env: env, Functions: map[string]Function{}, StateMachines: map[string]StateMachine{}, Tables: map[string]Table{}, Queues: map[string]Queue{}}
	names := map[string]string{} // logical id -> short name, of functions, machines, queues
	logDays := map[string]int{}  // log group logical id -> retention
	for id, r := range tp.Resources {
		p := r.Properties
		switch r.Type {
		case "AWS::Lambda::Function":
			names[id] = short(p["FunctionName"])
		case "AWS::StepFunctions::StateMachine":
			names[id] = short(p["StateMachineName"])
		case "AWS::SQS::Queue":
			names[id] = short(p["QueueName"])
			d.Queues[names[id]] = Queue{FIFO: p["FifoQueue"] == true}
		case "AWS::Logs::LogGroup":
			logDays[id] = intOf(p["RetentionInDays"])
		}
	}
	for id, r := range tp.Resources {
		p := r.Properties
		switch r.Type {
		case "AWS::Lambda::Function":
			f := Function{MemoryMB: intOf(p["MemorySize"]), Arch: "x86_64"}
			if f.MemoryMB == 0 {
				f.MemoryMB = 128
			}
			if a, ok := p["Architectures"].([]any); ok && len(a) == 1 {
				f.Arch, _ = a[0].(string)
			}
			f.Tracing = dig(p, "TracingConfig", "Mode") == "Active"
			f.LogDays = logDays[refID(dig(p, "LoggingConfig", "LogGroup"))]
			switch dig(p, "LoggingConfig", "SystemLogLevel") {
			case "WARN", "ERROR", "FATAL":
				f.NoPlatformLogs = true
			}
			if env, ok := dig(p, "Environment", "Variables").(map[string]any); ok {
				for _, v := range env {
					if id := refID(v); id != "" && tp.Resources[id].Type == "AWS::StepFunctions::StateMachine" {
						f.StateMachines = append(f.StateMachines, names[id])
					}
				}
			}
			slices.Sort(f.StateMachines)
			d.Functions[names[id]] = f
		case "AWS::StepFunctions::StateMachine":
			def, err := resolve(p["DefinitionString"], names)
			if err != nil {
				return Design{}, fmt.Errorf("state machine %s: %w", names[id], err)
			}
			sm := StateMachine{Type: "STANDARD", Definition: json.RawMessage(def), LogLevel: "OFF"}
			if t, ok := p["StateMachineType"].(string); ok {
				sm.Type = t
			}
			if lc, ok := p["LoggingConfiguration"].(map[string]any); ok {
				if l, ok := lc["Level"].(string); ok {
					sm.LogLevel = l
				}
				sm.LogExecution = lc["IncludeExecutionData"] == true
				if ds, ok := lc["Destinations"].([]any); ok && len(ds) > 0 {
					sm.LogDays = logDays[refID(dig(ds[0].(map[string]any), "CloudWatchLogsLogGroup", "LogGroupArn"))]
				}
			}
			sm.Tracing = dig(p, "TracingConfiguration", "Enabled") == true
			d.StateMachines[names[id]] = sm
		case "AWS::DynamoDB::Table":
			t := Table{OnDemand: p["BillingMode"] == "PAY_PER_REQUEST", PITR: dig(p, "PointInTimeRecoverySpecification", "PointInTimeRecoveryEnabled") == true}
			if c, _ := p["TableClass"].(string); c != "STANDARD" {
				t.Class = c
			}
			gsis, _ := p["GlobalSecondaryIndexes"].([]any)
			for _, g := range gsis {
				g := g.(map[string]any)
				ix := Index{Name: g["IndexName"].(string)}
				for _, k := range g["KeySchema"].([]any) {
					ix.Keys = append(ix.Keys, k.(map[string]any)["AttributeName"].(string))
				}
				ix.Projection, _ = dig(g, "Projection", "ProjectionType").(string)
				if inc, ok := dig(g, "Projection", "NonKeyAttributes").([]any); ok {
					for _, a := range inc {
						ix.Include = append(ix.Include, a.(string))
					}
				}
				t.Indexes = append(t.Indexes, ix)
			}
			d.Tables[short(p["TableName"])] = t
		case "AWS::ApiGateway::Stage":
			api := API{Kind: "REST", Tracing: p["TracingEnabled"] == true, ExecutionLogs: "OFF"}
			if f, ok := dig(p, "AccessLogSetting", "Format").(string); ok {
				api.AccessLogBytes = len(f)
				for gid := range logDays {
					if strings.Contains(toJSON(dig(p, "AccessLogSetting", "DestinationArn")), `"`+gid+`"`) {
						api.AccessLogDays = logDays[gid]
					}
				}
			}
			if ms, ok := p["MethodSettings"].([]any); ok && len(ms) > 0 {
				if l, ok := ms[0].(map[string]any)["LoggingLevel"].(string); ok {
					api.ExecutionLogs = l
				}
			}
			// The function every proxy method of the stage's API integrates with.
			restID := refID(p["RestApiId"])
			for _, m := range tp.Resources {
				if m.Type != "AWS::ApiGateway::Method" || refID(m.Properties["RestApiId"]) != restID {
					continue
				}
				uri := toJSON(dig(m.Properties, "Integration", "Uri"))
				for fid, n := range names {
					if tp.Resources[fid].Type == "AWS::Lambda::Function" && strings.Contains(uri, `"`+fid+`"`) {
						if api.Function != "" && api.Function != n {
							return Design{}, fmt.Errorf("REST API's methods go to %s and %s: which one a reclaim calls is not known", api.Function, n)
						}
						api.Function = n
					}
				}
			}
			d.APIs = append(d.APIs, api)
		case "AWS::ApiGatewayV2::Api":
			return Design{}, fmt.Errorf("an HTTP API (%s): not priced yet", id)
		}
	}
	for _, r := range tp.Resources {
		if r.Type == "AWS::Lambda::EventSourceMapping" {
			q, fn := names[refID(r.Properties["EventSourceArn"])], names[refID(r.Properties["FunctionName"])]
			if q != "" && fn != "" {
				f := d.Functions[fn]
				f.Queues = append(f.Queues, q)
				slices.Sort(f.Queues)
				d.Functions[fn] = f
			}
		}
	}
	return d, nil
}

// resolve turns a DefinitionString (a string, or an Fn::Join of strings and references)
// into the definition's JSON, each reference written as the short name of what it names
// (a function, a state machine, a queue), or "?" for one the design has no name for.
func resolve(v any, names map[string]string) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case map[string]any:
		j, ok := v["Fn::Join"].([]any)
		if !ok || len(j) != 2 {
			return "", fmt.Errorf("definition is neither a string nor an Fn::Join: %s", toJSON(v))
		}
		var b strings.Builder
		parts, _ := j[1].([]any)
		for _, p := range parts {
			if s, ok := p.(string); ok {
				b.WriteString(s)
				continue
			}
			if n, ok := names[refID(p)]; ok {
				b.WriteString(n)
			} else if pseudo, ok := pseudoParams[refID(p)]; ok {
				b.WriteString(pseudo)
			} else {
				b.WriteString("?")
			}
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("definition of type %T", v)
}

var pseudoParams = map[string]string{"AWS::Partition": "aws", "AWS::Region": "region", "AWS::AccountId": "account", "AWS::URLSuffix": "amazonaws.com"}

// refID is the logical id a Ref or an Fn::GetAtt names ("" for anything else).
func refID(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	if r, ok := m["Ref"].(string); ok {
		return r
	}
	if g, ok := m["Fn::GetAtt"].([]any); ok && len(g) > 0 {
		s, _ := g[0].(string)
		return s
	}
	return ""
}

func dig(m map[string]any, path ...string) any {
	var v any = m
	for _, k := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func intOf(v any) int {
	switch v := v.(type) {
	case float64:
		return int(v)
	case int:
		return v
	}
	return 0
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
