package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	sfntypes "github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

type cfnStateMachine struct {
	StateMachineName        string
	StateMachineType        string
	RoleArn                 string
	DefinitionString        string
	Definition              any
	DefinitionS3Location    any
	DefinitionSubstitutions map[string]any
}

func provisionStateMachine(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var sm cfnStateMachine
	if err := decodeProps(props, &sm); err != nil {
		return nil, err
	}

	name := valueOr(sm.StateMachineName, generatedName(p.stackName, id, 80))

	definition, err := sm.definition()
	if err != nil {
		return nil, fmt.Errorf("state machine %s: %w", name, err)
	}

	in := &sfn.CreateStateMachineInput{
		Name:       aws.String(name),
		Definition: aws.String(definition),
		RoleArn:    aws.String(valueOr(sm.RoleArn, fmt.Sprintf("arn:%s:iam::%s:role/%s-local", partition, accountID, name))),
	}
	if sm.StateMachineType != "" {
		in.Type = sfntypes.StateMachineType(sm.StateMachineType)
	}

	out, err := p.sfn.CreateStateMachine(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("create state machine %s: %w", name, err)
	}

	arn := aws.ToString(out.StateMachineArn)
	p.quotaRes.StateMachines = append(p.quotaRes.StateMachines, quota.StateMachine{ARN: arn, Type: valueOr(sm.StateMachineType, "STANDARD"), Definition: definition})
	p.log.Info("created state machine", "name", name)

	return &physical{ref: arn, attrs: map[string]any{"Arn": arn, "Name": name}}, nil
}

// definition returns the ASL document with DefinitionSubstitutions applied.
func (sm *cfnStateMachine) definition() (string, error) {
	def := sm.DefinitionString

	switch {
	case def != "":
	case sm.Definition != nil:
		data, err := json.Marshal(sm.Definition)
		if err != nil {
			return "", fmt.Errorf("encode Definition: %w", err)
		}

		def = string(data)
	case sm.DefinitionS3Location != nil:
		return "", fmt.Errorf("DefinitionS3Location is not supported locally")
	default:
		return "", fmt.Errorf("no DefinitionString or Definition")
	}

	for key, val := range sm.DefinitionSubstitutions {
		s, err := scalarString(val)
		if err != nil {
			return "", fmt.Errorf("substitution %s: %w", key, err)
		}

		def = strings.ReplaceAll(def, "${"+key+"}", s)
	}

	return def, nil
}

func provisionEventBus(ctx context.Context, p *provisioner, _ string, _ *resource, props map[string]any) (*physical, error) {
	var bus struct{ Name, Description string }
	if err := decodeProps(props, &bus); err != nil {
		return nil, err
	}

	out, err := p.eventbridge.CreateEventBus(ctx, &eventbridge.CreateEventBusInput{
		Name:        aws.String(bus.Name),
		Description: optString(bus.Description),
	})
	if err != nil {
		return nil, fmt.Errorf("create event bus %s: %w", bus.Name, err)
	}

	return &physical{ref: bus.Name, attrs: map[string]any{"Arn": aws.ToString(out.EventBusArn), "Name": bus.Name}}, nil
}

type cfnRule struct {
	Name               string
	Description        string
	EventBusName       string
	EventPattern       any
	ScheduleExpression string
	State              string
	RoleArn            string
	Targets            []struct {
		Id, Arn, Input, InputPath, RoleArn string
		InputTransformer                   *struct {
			InputPathsMap map[string]string
			InputTemplate string
		}
	}
}

func provisionRule(ctx context.Context, p *provisioner, id string, _ *resource, props map[string]any) (*physical, error) {
	var rule cfnRule
	if err := decodeProps(props, &rule); err != nil {
		return nil, err
	}

	name := valueOr(rule.Name, generatedName(p.stackName, id, 64))
	bus := eventBusName(rule.EventBusName)

	in := &eventbridge.PutRuleInput{
		Name:               aws.String(name),
		Description:        optString(rule.Description),
		EventBusName:       optString(bus),
		ScheduleExpression: optString(rule.ScheduleExpression),
		RoleArn:            optString(rule.RoleArn),
		State:              ebtypes.RuleState(valueOr(rule.State, string(ebtypes.RuleStateEnabled))),
	}

	if rule.ScheduleExpression != "" && rule.EventPattern == nil && in.State != ebtypes.RuleStateDisabled {
		// kumo never fires schedules, and it matches a rule without an event pattern against
		// every event put on the bus: enabled, a schedule rule would run its target on any event.
		in.State = ebtypes.RuleStateDisabled
		p.log.Warn("schedule rule created DISABLED: kumo never fires schedules (and would deliver every event to it); invoke its target yourself",
			"rule", name, "schedule", rule.ScheduleExpression)
	}

	switch pattern := rule.EventPattern.(type) {
	case nil:
	case string:
		in.EventPattern = aws.String(pattern)
	default:
		data, err := json.Marshal(pattern)
		if err != nil {
			return nil, fmt.Errorf("rule %s: encode EventPattern: %w", name, err)
		}

		in.EventPattern = aws.String(string(data))
	}

	out, err := p.eventbridge.PutRule(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("put rule %s: %w", name, err)
	}

	if len(rule.Targets) > 0 {
		targets := make([]ebtypes.Target, len(rule.Targets))

		for i, t := range rule.Targets {
			targets[i] = ebtypes.Target{
				Id:        aws.String(t.Id),
				Arn:       aws.String(t.Arn),
				Input:     optString(t.Input),
				InputPath: optString(t.InputPath),
				RoleArn:   optString(t.RoleArn),
			}

			if tr := t.InputTransformer; tr != nil {
				targets[i].InputTransformer = &ebtypes.InputTransformer{
					InputPathsMap: tr.InputPathsMap,
					InputTemplate: aws.String(tr.InputTemplate),
				}
			}

			if strings.Contains(t.Arn, ":states:") {
				p.log.Warn("kumo does not deliver EventBridge events to Step Functions targets; route them through a Lambda",
					"rule", name, "target", t.Arn)
			}
		}

		res, err := p.eventbridge.PutTargets(ctx, &eventbridge.PutTargetsInput{
			Rule:         aws.String(name),
			EventBusName: optString(bus),
			Targets:      targets,
		})
		if err != nil {
			return nil, fmt.Errorf("put targets of rule %s: %w", name, err)
		}

		if res.FailedEntryCount > 0 {
			e := res.FailedEntries[0]

			return nil, fmt.Errorf("put targets of rule %s: target %s: %s", name, aws.ToString(e.TargetId), aws.ToString(e.ErrorMessage))
		}
	}

	p.log.Info("created event rule", "rule", name, "targets", len(rule.Targets))

	// On AWS the Ref of a rule on a custom bus is "bus|rule".
	ref := name
	if bus != "" && bus != "default" {
		ref = bus + "|" + name
	}

	return &physical{ref: ref, attrs: map[string]any{"Arn": aws.ToString(out.RuleArn)}}, nil
}

// eventBusName accepts a bus name or ARN (arn:aws:events:region:account:event-bus/name).
func eventBusName(nameOrARN string) string {
	if _, name, ok := strings.Cut(nameOrARN, ":event-bus/"); ok {
		return name
	}

	return nameOrARN
}
